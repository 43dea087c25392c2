// The Read tab's viewer: one Cornerstone3D stack viewport over the study's full-bit-depth pixels.
//
// The server decodes the de-identified DICOM once (pydicom, the same decoder the model reads through) and sends
// its values, modality LUT applied and MONOCHROME1 mirrored, as a raw little-endian array with its geometry,
// default window and presets in one header (app/viewer_routes.py). So every codec the server reads is viewable
// here without shipping WebAssembly decoders, and window/level, zoom and pan run in the browser at frame rate.
//
// Mouse: left = the chosen tool (window/level, pan or zoom), middle = pan, right = window/level, wheel = zoom
// about the cursor. Keys (with the viewer focused): 1-5 presets, i invert, f or = fit, 0 one image pixel per
// screen pixel, + and - zoom, w / p / z choose the left-button tool, r or space reset.
import {
  Enums,
  RenderingEngine,
  cache,
  getRenderingCapabilities,
  imageLoader,
  init as initCore,
  metaData,
  setUseCPURendering,
  utilities,
} from '@cornerstonejs/core';
import {
  Enums as ToolEnums,
  PanTool,
  ToolGroupManager,
  WindowLevelTool,
  ZoomTool,
  addTool,
  init as initTools,
} from '@cornerstonejs/tools';

const SCHEME = 'orapo';
const PRESET_ORDER = ['lung', 'mediastinum', 'bone', 'default', 'full'];
const TOOL_KEYS = { w: 'wl', p: 'pan', z: 'zoom' };
const { MouseBindings } = ToolEnums;
const images = new Map(); // imageId -> the header the server sent with its pixels

// Cornerstone tunes its window/level drag to the image's dynamic range, which it measures by scanning every
// pixel on every mouse move; the server already sent the range.
class OrapoWindowLevelTool extends WindowLevelTool {
  static toolName = 'OrapoWindowLevel';

  _getMultiplierFromDynamicRange(viewport) {
    const meta = images.get(viewport.getCurrentImageId());
    if (!meta) return super._getMultiplierFromDynamicRange(viewport);
    const ratio = Math.max(meta.range[1] - meta.range[0], 1) / 1024;
    return ratio > 1 ? Math.round(ratio) : ratio;
  }
}

// Cornerstone zooms 5% per wheel notch; twice that, about the cursor still, is closer to what readers expect.
class OrapoZoomTool extends ZoomTool {
  static toolName = 'OrapoZoom';

  mouseWheelCallback(evt) {
    this._zoom(evt);
    this._zoom(evt);
  }
}

const TOOLS = { wl: OrapoWindowLevelTool.toolName, pan: PanTool.toolName, zoom: OrapoZoomTool.toolName };
const ARRAYS = { uint8: Uint8Array, uint16: Uint16Array, int16: Int16Array, float32: Float32Array };
const BITS = { uint8: 8, uint16: 16, int16: 16, float32: 32 };

function metadataProvider(type, imageId) {
  const meta = images.get(imageId);
  if (!meta) return undefined;
  switch (type) {
    case 'generalSeriesModule':
      return { modality: meta.modality || 'DX' };
    case 'imagePixelModule':
      return {
        bitsAllocated: BITS[meta.dtype], bitsStored: meta.bits_stored || BITS[meta.dtype], highBit: BITS[meta.dtype] - 1,
        pixelRepresentation: meta.dtype === 'int16' ? 1 : 0, photometricInterpretation: 'MONOCHROME2', samplesPerPixel: 1,
      };
    case 'imagePlaneModule':
      return {
        rows: meta.rows, columns: meta.columns, rowCosines: [1, 0, 0], columnCosines: [0, 1, 0],
        imageOrientationPatient: [1, 0, 0, 0, 1, 0], imagePositionPatient: [0, 0, 0], pixelSpacing: [1, 1],
        rowPixelSpacing: 1, columnPixelSpacing: 1, frameOfReferenceUID: imageId, sliceThickness: 1, sliceLocation: 0,
      };
    case 'voiLutModule':
      return { windowCenter: [meta.window[0]], windowWidth: [meta.window[1]] };
    case 'modalityLutModule':
      return { rescaleSlope: 1, rescaleIntercept: 0 };
    default:
      return undefined;
  }
}

async function fetchImage(imageId) {
  const url = imageId.slice(SCHEME.length + 1);
  const response = await fetch(url, { credentials: 'same-origin', cache: 'no-store' });
  if (!response.ok) {
    const error = new Error(`The image could not be loaded (${response.status}).`);
    error.status = response.status;
    throw error;
  }
  const meta = JSON.parse(response.headers.get('X-Orapo-Image'));
  const pixels = new ARRAYS[meta.dtype](await response.arrayBuffer());
  if (pixels.length !== meta.rows * meta.columns) throw new Error('The image arrived incomplete.');
  images.set(imageId, meta);
  const voxelManager = utilities.VoxelManager.createImageVoxelManager({
    width: meta.columns, height: meta.rows, numberOfComponents: 1, scalarData: pixels,
  });
  return {
    imageId, minPixelValue: meta.range[0], maxPixelValue: meta.range[1], slope: 1, intercept: 0,
    windowCenter: meta.window[0], windowWidth: meta.window[1], voiLUTFunction: 'LINEAR',
    getPixelData: () => voxelManager.getScalarData(), getCanvas: undefined, rows: meta.rows, columns: meta.columns,
    height: meta.rows, width: meta.columns, color: false, rgba: false, numberOfComponents: 1,
    columnPixelSpacing: 1, rowPixelSpacing: 1, invert: false, sizeInBytes: pixels.byteLength,
    dataType: pixels.constructor.name, photometricInterpretation: 'MONOCHROME2', voxelManager,
  };
}

let initialised = false;
function initOnce() {
  if (initialised) return;
  initCore();
  // A software WebGL (SwiftShader, llvmpipe: no GPU, a VM, headless) draws a 2-D stack slower than
  // Cornerstone's CPU path does; `window.ORAPO_VIEWER_RENDER = 'gpu' | 'cpu'` overrides, for measuring.
  const caps = getRenderingCapabilities();
  const forced = window.ORAPO_VIEWER_RENDER;
  setUseCPURendering(forced ? forced === 'cpu' : (!caps.webgl || !!caps.softwareRasterizer));
  initTools();
  metaData.addProvider(metadataProvider, 10000);
  imageLoader.registerImageLoader(SCHEME, (imageId) => ({ promise: fetchImage(imageId) }));
  [OrapoWindowLevelTool, PanTool, OrapoZoomTool].forEach((tool) => addTool(tool));
  initialised = true;
}

// LINEAR window (DICOM PS3.3 C.11.2.1.2), as the server's presets are computed: centre and width <-> range.
const toRange = (center, width) => ({ lower: center - 0.5 - (width - 1) / 2, upper: center - 0.5 + (width - 1) / 2 });
const toWindow = ({ lower, upper }) => [(lower + upper) / 2 + 0.5, upper - lower + 1];

let serial = 0;

class Viewer {
  constructor(root) {
    initOnce();
    this.root = root;
    this.id = `orapo-viewer-${++serial}`;
    this.el = root.querySelector('[data-viewport]');
    this.status = root.querySelector('[data-status]');
    this.inputs = { center: root.querySelector('[data-input=center]'), width: root.querySelector('[data-input=width]') };
    this.frames = [];
    this.meta = null;
    this.token = 0;
    this.tool = 'wl';
    this.engine = new RenderingEngine(this.id);
    this.engine.enableElement({ viewportId: this.id, type: Enums.ViewportType.STACK, element: this.el,
      defaultOptions: { background: [0, 0, 0] } });
    this.viewport = this.engine.getViewport(this.id);
    this.tools = ToolGroupManager.createToolGroup(this.id);
    Object.values(TOOLS).forEach((name) => this.tools.addTool(name));
    this.tools.addViewport(this.id, this.id);
    this.setTool('wl');
    this.bind();
    new ResizeObserver(() => { this.engine.resize(true, false); this.report(); }).observe(this.el);
  }

  bind() {
    const { root, el } = this;
    el.addEventListener('contextmenu', (e) => e.preventDefault());
    el.addEventListener('pointerdown', () => root.focus({ preventScroll: true }));
    el.addEventListener(Enums.Events.IMAGE_RENDERED, () => {
      this.frames.push(performance.now());
      if (this.frames.length > 600) this.frames.splice(0, 300);
      if (this.pendingFirstFrame) {
        this.pendingFirstFrame.resolve(performance.now());
        this.pendingFirstFrame = null;
      }
    });
    el.addEventListener(Enums.Events.VOI_MODIFIED, () => this.report());
    el.addEventListener(Enums.Events.CAMERA_MODIFIED, () => this.report());
    root.querySelectorAll('[data-preset]').forEach((b) => b.addEventListener('click', () => this.preset(b.dataset.preset)));
    root.querySelectorAll('[data-tool]').forEach((b) => b.addEventListener('click', () => this.setTool(b.dataset.tool)));
    root.querySelectorAll('[data-action]').forEach((b) => b.addEventListener('click', () => this.action(b.dataset.action)));
    for (const input of Object.values(this.inputs)) {
      // live: every keystroke, arrow key and spinner click re-windows; Enter as well
      input.addEventListener('input', () => this.typedWindow());
      input.addEventListener('keydown', (e) => { if (e.key === 'Enter') this.typedWindow(); });
    }
    root.addEventListener('keydown', (e) => this.key(e));
  }

  key(e) {
    if (e.target.closest('input, textarea, select') || e.ctrlKey || e.metaKey || e.altKey || !this.meta) return;
    const k = e.key.toLowerCase();
    const n = Number(e.key);
    if (n >= 1 && n <= PRESET_ORDER.length) this.preset(PRESET_ORDER[n - 1]);
    else if (k === 'i') this.action('invert');
    else if (k === 'f' || k === '=') this.action('fit');
    else if (k === '0') this.action('actual');
    else if (k === '+') this.zoomBy(1.25);
    else if (k === '-') this.zoomBy(0.8);
    else if (k === 'r' || k === ' ') this.action('reset');
    else if (TOOL_KEYS[k]) this.setTool(TOOL_KEYS[k]);
    else return;
    e.preventDefault();
  }

  async show(src) {
    const token = ++this.token;
    if (!src) {
      this.meta = null;
      this.root.dataset.state = 'empty';
      this.status.textContent = 'No study open.';
      return;
    }
    const imageId = `${SCHEME}:${src}`;
    const started = performance.now();
    this.root.dataset.state = 'loading';
    this.status.textContent = 'Loading the image…';
    if (this.viewport.getCurrentImageId() !== imageId) {
      for (const id of [...images.keys()]) if (id !== imageId) images.delete(id);
      cache.purgeCache(); // one study's pixels at a time: a radiograph is tens of megabytes once on the GPU
    }
    try {
      await this.viewport.setStack([imageId]);
      if (!images.has(imageId)) await imageLoader.loadAndCacheImage(imageId); // setStack swallows load errors
    } catch (error) {
      if (token !== this.token) return;
      this.meta = null;
      this.root.dataset.state = 'error';
      this.status.textContent = error.status === 403 || error.status === 404
        ? 'This image is not yours to view, or it no longer exists.' : String(error.message || error);
      return;
    }
    if (token !== this.token) return;
    this.meta = images.get(imageId);
    // the image is in the viewport now: the next frame rendered is the first to show it
    const firstFrame = new Promise((resolve) => { this.pendingFirstFrame = { resolve }; });
    this.viewport.resetCamera();
    this.viewport.setProperties({ voiRange: toRange(...this.meta.window), invert: false });
    this.viewport.render();
    const shown = await firstFrame;
    if (token !== this.token) return;
    this.firstFrameMs = shown - started;
    this.firstFrameAt = shown;
    this.root.dataset.state = 'ready';
    this.root.dataset.image = src;
    this.report();
  }

  setTool(name) {
    this.tool = name;
    const bindings = { wl: [MouseBindings.Secondary], pan: [MouseBindings.Auxiliary], zoom: [MouseBindings.Wheel] };
    bindings[name] = [...bindings[name], MouseBindings.Primary];
    for (const [key, toolName] of Object.entries(TOOLS)) { // setToolActive adds bindings: clear them first
      this.tools.setToolPassive(toolName, { removeAllBindings: true });
      this.tools.setToolActive(toolName, { bindings: bindings[key].map((mouseButton) => ({ mouseButton })) });
    }
    this.root.querySelectorAll('[data-tool]').forEach((b) => b.setAttribute('aria-pressed', String(b.dataset.tool === name)));
  }

  preset(name) {
    const win = this.meta && this.meta.presets[name];
    if (!win) return;
    this.viewport.setProperties({ voiRange: toRange(...win) });
    this.viewport.render();
    this.root.dataset.window = name;
  }

  typedWindow() {
    const center = Number(this.inputs.center.value);
    const width = Number(this.inputs.width.value);
    if (!this.meta || !Number.isFinite(center) || !Number.isFinite(width) || width < 1
        || this.inputs.center.value === '' || this.inputs.width.value === '') return;
    this.viewport.setProperties({ voiRange: toRange(center, width) });
    this.viewport.render();
  }

  zoomBy(factor) {
    this.viewport.setZoom(this.viewport.getZoom() * factor);
    this.viewport.render();
  }

  // Canvas pixels per image pixel (1 = one image pixel per device pixel). Cornerstone's own zoom means that on
  // its CPU path but "relative to the fitted image" on its GPU path.
  magnification() {
    const zoom = this.viewport.getZoom();
    return this.viewport.useCPURendering ? zoom : zoom * this.fitScale();
  }

  fitScale() {
    const { canvas } = this.viewport;
    return Math.min(canvas.width / this.meta.columns, canvas.height / this.meta.rows);
  }

  action(name) {
    if (!this.meta) return;
    const vp = this.viewport;
    if (name === 'invert') {
      vp.setProperties({ invert: !vp.getProperties().invert });
    } else if (name === 'fit') {
      vp.resetCamera();
    } else if (name === 'actual') {
      vp.setZoom(vp.useCPURendering ? 1 : 1 / this.fitScale());
    } else if (name === 'reset') {
      vp.resetCamera();
      vp.setProperties({ voiRange: toRange(...this.meta.window), invert: false });
      delete this.root.dataset.window;
    }
    vp.render();
    this.report();
  }

  // What the viewer shows now; tests and benchmarks/bench_viewer.py read it (`element.orapoViewer.state()`).
  state() {
    const props = this.viewport.getProperties();
    const [center, width] = props.voiRange ? toWindow(props.voiRange) : [null, null];
    return {
      center, width, invert: !!props.invert, zoom: this.magnification(), pan: this.viewport.getPan(),
      tool: this.tool, image: this.root.dataset.image || null, frames: this.frames.slice(),
      firstFrameMs: this.firstFrameMs, firstFrameAt: this.firstFrameAt,
      cpu: !!this.viewport.useCPURendering,
    };
  }

  report() {
    const props = this.meta && this.viewport.getProperties();
    if (!props || !props.voiRange) return;
    const [center, width] = toWindow(props.voiRange).map(Math.round);
    const active = document.activeElement;
    if (active !== this.inputs.center) this.inputs.center.value = center;
    if (active !== this.inputs.width) this.inputs.width.value = width;
    const depth = this.meta.bits_stored ? `${this.meta.bits_stored}-bit` : this.meta.dtype;
    this.status.textContent = `L ${center} W ${width} · zoom ${Math.round(this.magnification() * 100)}%`
      + `${props.invert ? ' · inverted' : ''} · ${this.meta.columns}×${this.meta.rows} ${depth}`;
  }
}

// Called by the gr.HTML component's js_on_load (app/tabs/viewer.py): `root` holds the template's markup,
// `props.value` the address of the study's pixels ("" for none), `watch` re-runs on every new value.
function mount(root, props, watch) {
  const viewer = new Viewer(root);
  root.orapoViewer = viewer;
  viewer.show(props.value);
  watch('value', () => viewer.show(props.value));
  return viewer;
}

window.OrapoViewer = { mount };
