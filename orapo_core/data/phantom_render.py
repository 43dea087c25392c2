"""Draws a PhantomCXR frontal radiograph from a list of findings.

Not a physical simulation: the image is a sum of attenuation layers (body,
air in the lungs, heart, bones, findings, metal) pushed through 1 - exp(-kA).
Each finding is drawn with the cue a reader names in the report -- the
cardiothoracic ratio, a blunted costophrenic angle with a meniscus, a pleural
line with no lung markings beyond it -- and drawn large and consistent enough
to survive resizing to ~224 px, because the point is a learnable signal with
known ground truth, not realistic texture. Everything is whole-array numpy on
a normalised grid (x, y in [0, 1], y down; patient right on the image left).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
from PIL import Image

from orapo_core.data.phantom_finding import DrawnFinding, required

#: A point (x, y) in normalised image units: a pair of numbers, or an array of two.
Point = Sequence[float] | np.ndarray


@dataclass
class Anatomy:
    """Per-study geometry, in normalised image units."""

    cx: float  # midline
    tw: float  # half the inner thoracic width (lateral lung edge to midline)
    apex: float  # lung apices
    yd: dict[str, float]  # costophrenic-angle level per side ("right", "left")
    dome: float  # how far the hemidiaphragm domes above the angle
    ctr: float  # cardiothoracic ratio
    heart_cy: float
    heart_ry: float
    heart_dx: float
    mediastinum: float  # upper mediastinal half-width


@lru_cache(maxsize=4)
def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    y = (y + 0.5) / size
    x = (x + 0.5) / size
    y.setflags(write=False)
    x.setflags(write=False)
    return y, x


def _soft(margin: np.ndarray, eps: float) -> np.ndarray:
    """A mask from a signed margin (positive inside), 0.5 exactly on the edge."""
    return np.clip(margin / eps + 0.5, 0.0, 1.0)


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Band-limited noise in about [-1, 1]: a coarse random grid upsampled bicubically."""
    coarse = rng.standard_normal((cells, cells)).astype(np.float32)
    return np.asarray(Image.fromarray(coarse).resize((size, size), Image.Resampling.BICUBIC)) / 1.5


def _lateral(x: np.ndarray, a: Anatomy, side: str) -> np.ndarray:
    """Distance from the midline towards the given patient side."""
    return (a.cx - x) if side == "right" else (x - a.cx)


def _lung_edge(y: np.ndarray, a: Anatomy, side: str) -> np.ndarray:
    yd = a.yd[side]
    t = np.clip((y - a.apex) / (yd - a.apex), 0.0, 1.0)
    return a.tw * (0.72 + 0.28 * np.sqrt(t))


def _diaphragm(q: np.ndarray, a: Anatomy, side: str) -> np.ndarray:
    # Lowest at the lateral wall (the costophrenic angle), doming medially.
    t = np.clip((a.tw - q) / (0.55 * a.tw), 0.0, 1.0)
    return a.yd[side] - a.dome * np.sqrt(t)


def lung_margin(y: np.ndarray, x: np.ndarray, a: Anatomy, side: str) -> np.ndarray:
    q = _lateral(x, a, side)
    top = a.apex + 0.55 * ((q - 0.5 * a.tw) / a.tw) ** 2
    return np.minimum.reduce([q - 0.03, _lung_edge(y, a, side) - q, y - top, _diaphragm(q, a, side) - y])


def heart_mask(y: np.ndarray, x: np.ndarray, a: Anatomy) -> np.ndarray:
    hw = a.ctr * a.tw  # CTR = heart width / thoracic width = hw / tw
    hx = a.cx + a.heart_dx
    r = np.sqrt(((x - hx) / hw) ** 2 + ((y - a.heart_cy) / a.heart_ry) ** 2)
    return _soft((1.0 - r) * min(hw, a.heart_ry), 0.004)


def _segment(field: np.ndarray, size: int, p0: Point, p1: Point, width: float, value: float) -> None:
    """Adds a bright capsule from p0 to p1 (normalised x, y), touching only its bounding box."""
    pad = width * 2 + 2.0 / size
    x0, x1 = sorted((p0[0], p1[0]))
    y0, y1 = sorted((p0[1], p1[1]))
    c0, c1 = max(int((x0 - pad) * size), 0), min(int((x1 + pad) * size) + 1, size)
    r0, r1 = max(int((y0 - pad) * size), 0), min(int((y1 + pad) * size) + 1, size)
    if c0 >= c1 or r0 >= r1:
        return
    gy, gx = _grid(size)
    py, px = gy[r0:r1, c0:c1], gx[r0:r1, c0:c1]
    dx, dy = p1[0] - p0[0], p1[1] - p0[1]
    length2 = dx * dx + dy * dy or 1e-9
    t = np.clip(((px - p0[0]) * dx + (py - p0[1]) * dy) / length2, 0.0, 1.0)
    dist = np.hypot(px - (p0[0] + t * dx), py - (p0[1] + t * dy))
    patch = field[r0:r1, c0:c1]
    np.maximum(patch, value * _soft(width - dist, 1.2 / size), out=patch)


def _curve(field: np.ndarray, size: int, points: Sequence[Point], width: float, value: float, steps: int = 10) -> None:
    """A smooth tube through the control points (a chain of quadratic Béziers)."""
    pts = np.asarray(points, dtype=np.float64)
    if len(pts) == 2:
        _segment(field, size, pts[0], pts[1], width, value)
        return
    sampled = [pts[0]]
    for i in range(1, len(pts) - 1):
        a = pts[0] if i == 1 else (pts[i - 1] + pts[i]) / 2
        c = pts[-1] if i == len(pts) - 2 else (pts[i] + pts[i + 1]) / 2
        for t in np.linspace(0, 1, steps)[1:]:
            sampled.append((1 - t) ** 2 * a + 2 * (1 - t) * t * pts[i] + t**2 * c)
    for p0, p1 in zip(sampled[:-1], sampled[1:]):
        _segment(field, size, p0, p1, width, value)


def _bones(
    y: np.ndarray, x: np.ndarray, a: Anatomy, size: int, fractures: list[tuple[str, int]], look: dict[str, float]
) -> np.ndarray:
    bone = np.zeros_like(y)
    # Spine, faint through the mediastinum.
    bone += 0.10 * _soft(0.028 - np.abs(x - a.cx), 0.01)
    q_abs = np.abs(x - a.cx)
    right = x < a.cx
    span = a.yd["right"] - a.apex
    for k in range(10):
        yk = a.apex - 0.02 + k * span / 10.5
        r0, r1 = max(int((yk - 0.05) * size), 0), min(int((yk + 0.16) * size) + 1, size)
        if r0 >= r1:
            continue
        py, q = y[r0:r1], q_abs[r0:r1]
        t = q / a.tw
        curve = yk - 0.03 * np.sin(np.pi * np.clip(t, 0, 1)) + 0.13 * t**2
        band = _soft(0.011 - np.abs(py - curve), 0.004) * _soft(q - 0.03, 0.01) * _soft(a.tw * 1.05 - q, 0.01)
        for side, rib in fractures:
            if rib != k + 1:
                continue
            on_side = right[r0:r1] if side == "right" else ~right[r0:r1]
            qf = 0.62 * a.tw
            step = look["fracture"]  # how far the break gapes and steps
            gap = _soft(np.abs(q - qf) - 0.01 * step, 0.003)
            # The lateral fragment is displaced downwards: a visible step.
            shifted = (
                _soft(0.011 * step - np.abs(py - curve - 0.014 * step), 0.004)
                * _soft(q - 0.03, 0.01)
                * _soft(a.tw * 1.05 - q, 0.01)
            )
            broken = np.where(q > qf, shifted, band) * gap
            if look["callus"]:  # a healing fracture's callus: a dense knot of bone around the break
                yc = yk - 0.03 * np.sin(np.pi * min(qf / a.tw, 1.0)) + 0.13 * (qf / a.tw) ** 2 + 0.007 * step
                broken = broken + 4.0 * look["callus"] * _soft(0.035 - np.hypot(q - qf, py - yc), 0.005)
            band = np.where(on_side, broken, band)
        bone[r0:r1] += 0.08 * band
    # Clavicles: thick bars from the sternal notch up and out to the shoulders.
    for sign in (-1.0, 1.0):
        p0 = (a.cx + sign * 0.035, a.apex + 0.035)
        p1 = (a.cx + sign * (a.tw + 0.08), a.apex - 0.035)
        clav = np.zeros_like(y)
        _segment(clav, size, p0, p1, 0.014, 1.0)
        bone += 0.22 * clav
    return bone


def _lung_markings(
    rng: np.random.Generator, y: np.ndarray, x: np.ndarray, a: Anatomy, hilum_y: float, size: int
) -> np.ndarray:
    """Vessels: streaks radiating from each hilum and tapering outwards, plus fine texture."""
    out = np.zeros_like(y)
    bins = 720
    centers = np.arange(bins) * (2 * np.pi / bins)
    for side in ("right", "left"):
        q = _lateral(x, a, side)
        dq, dy = q - 0.08, y - hilum_y
        r = np.hypot(dq, dy)
        theta = np.arctan2(dy, dq) + 0.06 * np.sin(r * 40.0 + rng.uniform(0, 6.28))
        profile = np.zeros(bins, dtype=np.float32)
        for angle in rng.uniform(-np.pi, np.pi, 40):
            d = np.angle(np.exp(1j * (centers - angle)))
            profile += np.exp(-((d / 0.03) ** 2)).astype(np.float32)
        idx = ((theta % (2 * np.pi)) * (bins / (2 * np.pi))).astype(np.int32) % bins
        out += np.minimum(profile[idx], 1.0) * np.exp(-r / 0.45) * np.clip(r / 0.03, 0, 1)
    out += 0.3 * _smooth_noise(rng, size, max(size // 6, 8)) + 0.15 * _smooth_noise(rng, size, max(size // 3, 16))
    return out


def _lobe_region(y: np.ndarray, x: np.ndarray, a: Anatomy, side: str, zone: str) -> np.ndarray:
    q = _lateral(x, a, side)
    yd = a.yd[side]
    if zone == "upper":
        return _soft(a.apex + 0.22 - y + 0.04 * q / a.tw, 0.02)
    if zone == "middle":
        mid = _soft(y - (a.heart_cy - 0.09), 0.02) * _soft(yd - 0.05 - y, 0.02)
        return mid * _soft(0.65 * a.tw - q, 0.02)
    return _soft(y - (yd - 0.21 - 0.05 * (1 - q / a.tw)), 0.02)


def _blobs(
    rng: np.random.Generator, y: np.ndarray, x: np.ndarray, a: Anatomy, side: str, zone: str, count: int, size: int
) -> np.ndarray:
    region = _lobe_region(y, x, a, side, zone)
    field = np.zeros_like(y)
    ys = {
        "upper": (a.apex + 0.06, a.apex + 0.18),
        "middle": (a.heart_cy - 0.06, a.heart_cy + 0.04),
        "lower": (a.yd[side] - 0.16, a.yd[side] - 0.05),
    }[zone]
    for _ in range(count):
        q0 = rng.uniform(0.35, 0.8) * a.tw
        bx = a.cx - q0 if side == "right" else a.cx + q0
        by = rng.uniform(*ys)
        s = rng.uniform(0.03, 0.05)
        field = np.maximum(field, np.exp(-(((x - bx) ** 2 + (y - by) ** 2) / (2 * s * s))))
    mottle = 0.75 + 0.25 * _smooth_noise(rng, size, max(size // 10, 6))
    return np.clip(field * 1.4 * mottle, 0, 1) * (0.5 + 0.5 * region)


#: How conspicuous the small findings are drawn (lung lesion, rib fracture, other pleural findings). "subtle"
#: is the first PhantomCXR rendering: a 1-2 px nodule, a 2 px rib step and a 1 px pleural band at 96 px, below
#: what any linear readout of the film finds (probe AUC 0.44-0.65, issue 11). "clear" (the default) draws the
#: same findings, at the same places and prevalences and from the same random draws, large and dense enough to
#: be seen at the starter's 96 px: a nodule of 3-4 px, a fracture with a callus, a thicker, denser pleural band.
CONSPICUITY: dict[str, dict[str, float]] = {
    "subtle": {"lesion_size": 1.0, "lesion_density": 1.0, "fracture": 1.0, "callus": 0.0, "pleural": 1.0},
    "clear": {"lesion_size": 2.5, "lesion_density": 1.5, "fracture": 2.0, "callus": 1.0, "pleural": 2.0},
}
DEFAULT_CONSPICUITY = "clear"


def render(
    findings: Sequence[DrawnFinding],
    rng: np.random.Generator,
    size: int,
    conspicuity: str = DEFAULT_CONSPICUITY,
) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, tuple[int, int]]]:
    """Returns (image float32 in [0, 1], boolean masks, landmarks as (row, col))."""
    look = CONSPICUITY[conspicuity]
    y, x = _grid(size)
    by_kind: dict[str, list[DrawnFinding]] = {}
    for f in findings:
        by_kind.setdefault(f.kind, []).append(f)

    yd = rng.uniform(0.74, 0.79)
    a = Anatomy(
        cx=0.5 + rng.normal(0, 0.008),
        tw=rng.uniform(0.34, 0.38),
        apex=rng.uniform(0.13, 0.17),
        yd={"right": yd, "left": yd + rng.uniform(0.0, 0.02)},
        dome=rng.uniform(0.05, 0.075),
        ctr=rng.uniform(0.36, 0.46),
        heart_cy=0.0,
        heart_ry=rng.uniform(0.11, 0.13),
        heart_dx=rng.uniform(0.02, 0.04),
        mediastinum=rng.uniform(0.055, 0.065),
    )
    for f in by_kind.get("cardiomegaly", []):
        a.ctr = required(f.size, "size")
        a.heart_ry *= 1.12
    for f in by_kind.get("atelectasis", []):
        if f.variant == "lobar":  # volume loss: the hemidiaphragm rises
            a.yd[required(f.side, "side")] -= 0.045
    for f in by_kind.get("enlarged_cardiomediastinum", []):
        a.mediastinum = 0.12 if f.severity == "marked" and f.certain else 0.1
    a.heart_cy = min(a.yd["right"], a.yd["left"]) - 0.1

    lungs = {s: _soft(lung_margin(y, x, a, s), 0.006) for s in ("right", "left")}
    lung = lungs["right"] + lungs["left"]
    heart = heart_mask(y, x, a)
    upper = np.clip((a.heart_cy - y) / 0.08, 0, 1)
    knob = 0.02 * np.exp(-(((y - a.apex - 0.13) / 0.03) ** 2)) * (x > a.cx)
    mediastinum = _soft(a.mediastinum + knob - np.abs(x - a.cx), 0.006) * _soft(y - 0.02, 0.02) * upper
    occluded = np.maximum(heart, mediastinum)
    air = lung * (1.0 - occluded)

    body_half = 0.2 + 0.28 * np.clip((y - 0.02) / 0.14, 0, 1)
    atten = 0.9 * _soft(body_half - np.abs(x - a.cx), 0.015)
    atten -= 0.62 * air
    trachea = _soft(0.012 - np.abs(x - a.cx), 0.004) * _soft(a.apex + 0.16 - y, 0.01)
    atten -= 0.22 * trachea
    bubble = np.exp(-(((x - a.cx - 0.18) / 0.05) ** 2 + ((y - a.yd["left"] - 0.05) / 0.025) ** 2))
    atten -= 0.3 * bubble

    hilum_y = a.heart_cy - 0.12
    markings = _lung_markings(rng, y, x, a, hilum_y, size)
    masks: dict[str, np.ndarray] = {}

    # Pneumothorax: the lung falls away from the wall; beyond the pleural line
    # there is only air (darker, and no vessels).
    ptx = np.zeros_like(y)
    for f in by_kind.get("pneumothorax", []):
        side, severity = required(f.side, "side"), required(f.severity, "severity")
        q = _lateral(x, a, side)
        gap = {"small": 0.05, "moderate": 0.09, "large": 0.14}[severity]
        reach = {"small": 0.35, "moderate": 0.55, "large": 0.8}[severity]
        yd_s = a.yd[side]
        t = np.clip((y - a.apex) / (reach * (yd_s - a.apex)), 0, 1)
        pleural = _lung_edge(y, a, side) - gap * (1 - t**2)
        region = _soft(q - pleural, 0.004) * lungs[side] * (t < 1)
        ptx = np.maximum(ptx, region)
        line = np.exp(-(((q - pleural) / 0.0035) ** 2)) * lungs[side] * (t < 0.98)
        atten += 0.3 * line * (1 - region)
    masks["pneumothorax"] = ptx > 0.5
    atten += 0.2 * markings * air * (1 - ptx)
    atten -= 0.12 * ptx * air

    atten += _bones(
        y,
        x,
        a,
        size,
        [(required(f.side, "side"), int(required(f.location, "location"))) for f in by_kind.get("fracture", [])],
        look,
    )

    opacity = np.zeros_like(y)
    for kind, density in (("consolidation", 0.55), ("pneumonia", 0.5), ("lung_opacity", 0.3)):
        for f in by_kind.get(kind, []):
            side, zone = required(f.side, "side"), required(f.location, "location")
            d = density * (0.7 if not f.certain else 1.0)
            if f.variant == "lobar":
                region = _lobe_region(y, x, a, side, zone)
                mottle = 0.85 + 0.15 * _smooth_noise(rng, size, max(size // 12, 6))
                opacity = np.maximum(opacity, d * region * lungs[side] * mottle)
            else:
                opacity = np.maximum(opacity, d * _blobs(rng, y, x, a, side, zone, int(rng.integers(3, 6)), size))
    for f in by_kind.get("atelectasis", []):
        where = required(f.side, "side")
        sides = ("right", "left") if where == "bilateral" else (where,)
        for side in sides:
            if f.variant == "lobar":
                q = _lateral(x, a, side)
                base = a.yd[side] - 0.26
                tri = _soft(np.minimum(y - base - 1.2 * (q - 0.04), _diaphragm(q, a, side) - y), 0.01) * _soft(
                    q - 0.03, 0.01
                )
                opacity = np.maximum(opacity, 0.5 * tri)
            else:
                sign = -1 if side == "right" else 1
                yy = a.yd[side] - rng.uniform(0.07, 0.11)
                q0, q1 = rng.uniform(0.3, 0.4) * a.tw, rng.uniform(0.75, 0.85) * a.tw
                band = np.zeros_like(y)
                _curve(
                    band,
                    size,
                    [(a.cx + sign * q0, yy), (a.cx + sign * q1, yy - rng.uniform(-0.02, 0.02))],
                    0.008 if f.certain else 0.005,
                    1.0,
                )
                opacity = np.maximum(opacity, 0.5 * band)
    for f in by_kind.get("edema", []):
        severity = required(f.severity, "severity")
        amp = {"mild": 0.24, "moderate": 0.34, "severe": 0.44}[severity] * (0.8 if not f.certain else 1.0)
        for side in ("right", "left"):
            q = _lateral(x, a, side)
            haze = np.exp(-(((q - 0.09) / 0.16) ** 2) - ((y - hilum_y) / 0.17) ** 2)
            opacity = np.maximum(opacity, amp * haze * lungs[side])
            if severity != "mild":  # Kerley B lines at the lateral bases
                for k in range(4):
                    ky = a.yd[side] - 0.03 - 0.022 * k
                    qe = float(a.tw * (0.72 + 0.28 * np.sqrt((ky - a.apex) / (a.yd[side] - a.apex))))
                    sgn = -1 if side == "right" else 1
                    line = np.zeros_like(y)
                    _segment(line, size, (a.cx + sgn * (qe - 0.035), ky), (a.cx + sgn * (qe - 0.005), ky), 0.003, 1.0)
                    opacity = np.maximum(opacity, 0.4 * line)
    for f in by_kind.get("lung_lesion", []):
        side, zone, radius = required(f.side, "side"), required(f.location, "location"), required(f.size, "size")
        q0 = rng.uniform(0.4, 0.75) * a.tw
        bx = a.cx - q0 if side == "right" else a.cx + q0
        by = {"upper": a.apex + 0.1, "middle": a.heart_cy - 0.05, "lower": a.yd[side] - 0.12}[zone]
        theta = np.arctan2(y - by, x - bx)
        lobulated = radius * (1 + (0.12 * np.sin(3 * theta + rng.uniform(0, 6.28)) if f.variant == "mass" else 0))
        lobulated = lobulated * (look["lesion_size"] if f.variant == "nodule" else (1 + look["lesion_size"]) / 2)
        density = min(0.95, (0.55 if f.variant == "mass" else 0.45) * look["lesion_density"])
        opacity = np.maximum(opacity, density * _soft(lobulated - np.hypot(x - bx, y - by), 0.004))
    atten += opacity * (lung * (1 - 0.6 * occluded))

    effusion = np.zeros_like(y)
    for f in by_kind.get("pleural_effusion", []):
        where, severity = required(f.side, "side"), required(f.severity, "severity")
        h = {"small": 0.05, "moderate": 0.11, "large": 0.2}[severity] * (0.8 if not f.certain else 1.0)
        for side in ("right", "left") if where == "bilateral" else (where,):
            q = _lateral(x, a, side)
            # The meniscus: fluid climbs the lateral wall.
            level = a.yd[side] - h - 0.6 * h * np.clip((q - 0.5 * a.tw) / (0.5 * a.tw), 0, 1) ** 2
            space = np.minimum.reduce(
                [q - 0.03, _lung_edge(y, a, side) + 0.004 - q, _diaphragm(q, a, side) + 0.012 - y]
            )
            fluid = _soft(y - level, 0.02) * _soft(space, 0.006)
            effusion = np.maximum(effusion, fluid)
    masks["effusion"] = effusion > 0.5
    atten += 0.6 * effusion * air  # fluid replaces air; none outside the pleura or behind the heart

    for f in by_kind.get("pleural_other", []):
        side = required(f.side, "side")
        q = _lateral(x, a, side)
        edge = _lung_edge(y, a, side)
        thick = look["pleural"]  # how thick and dense the pleural band is drawn
        if f.variant == "apical_cap":
            cap = _soft(a.apex + 0.06 * thick - y, 0.01) * _soft(0.02 * thick - (edge - q), 0.004)
            atten += 0.35 * min(thick, 1.5) * cap * lungs[side]
        else:
            band = (
                _soft(0.014 * thick - np.abs(edge - 0.008 * thick - q), 0.004)
                * _soft(y - a.apex - 0.08, 0.01)
                * _soft(a.yd[side] - 0.02 - y, 0.01)
            )
            if f.variant == "plaques":
                band *= _smooth_noise(rng, size, 14) > 0.1
                band = band * 1.8
            atten += 0.3 * min(thick, 1.5) * band

    metal = np.zeros_like(y)
    carina = a.apex + 0.17
    for f in by_kind.get("support_devices", []):
        cx = a.cx
        if f.location == "ett":
            _curve(metal, size, [(cx, 0.0), (cx + 0.004, carina - 0.06)], 0.006, 1.0)
        elif f.location == "ng":
            _curve(
                metal,
                size,
                [
                    (cx + 0.01, 0.0),
                    (cx + 0.012, a.heart_cy),
                    (cx + 0.03, a.yd["left"] + 0.03),
                    (cx + 0.16, a.yd["left"] + 0.06),
                ],
                0.005,
                1.0,
            )
        elif f.location == "cvc":
            _curve(metal, size, [(cx - 0.15, 0.0), (cx - 0.06, a.apex + 0.06), (cx - 0.035, a.apex + 0.25)], 0.005, 1.0)
        elif f.location == "picc":
            _curve(
                metal,
                size,
                [
                    (cx + 0.47, a.apex + 0.02),
                    (cx + 0.2, a.apex + 0.02),
                    (cx + 0.02, a.apex + 0.1),
                    (cx - 0.03, a.apex + 0.24),
                ],
                0.004,
                1.0,
            )
        elif f.location == "pacemaker":
            gx, gy = cx + a.tw * 0.7, a.apex + 0.04
            box = _soft(np.minimum(0.045 - np.abs(x - gx), 0.03 - np.abs(y - gy)), 0.004)
            np.maximum(metal, box * 1.3, out=metal)
            _curve(
                metal, size, [(gx - 0.03, gy), (cx + 0.03, a.apex + 0.1), (cx - 0.03, a.heart_cy - 0.04)], 0.004, 1.0
            )
            _curve(
                metal,
                size,
                [(gx - 0.03, gy + 0.01), (cx + 0.02, a.apex + 0.14), (cx + 0.06, a.heart_cy + 0.06)],
                0.004,
                1.0,
            )
    atten += 1.2 * metal

    # Exposure: attenuation gain, gamma and a gentle heel-effect gradient vary per study.
    gain = rng.uniform(1.7, 2.3)
    image = 1.0 - np.exp(-gain * np.clip(atten, 0, None) * (1 + rng.uniform(-0.05, 0.05) * (y - 0.5)))
    image = image ** rng.uniform(0.85, 1.15)
    image = image + rng.normal(0, rng.uniform(0.006, 0.016), size=image.shape).astype(np.float32)
    image = np.clip(image, 0.0, 1.0).astype(np.float32)

    masks.update(
        heart=heart > 0.5, lung_right=lungs["right"] > 0.5, lung_left=lungs["left"] > 0.5, mediastinum=mediastinum > 0.5
    )
    landmarks = {}
    for side in ("right", "left"):
        sign = -1 if side == "right" else 1
        landmarks[f"cp_angle_{side}"] = (int(a.yd[side] * size), int((a.cx + sign * a.tw) * size))
    landmarks["carina"] = (int(carina * size), int(a.cx * size))
    return image, masks, landmarks
