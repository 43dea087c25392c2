// Bundles src/orapo-viewer.js with Cornerstone3D into one static script for the app, and writes the licences
// of every package that ends up in it next to it. Run by `make viewer` after `npm ci`; nothing is fetched here.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(here, '../app/static/viewer');
const pkg = JSON.parse(readFileSync(join(here, 'package.json'), 'utf8'));

// vtk.js's mesh reader (XML polydata, never used by a 2-D stack viewport) requires Node's `events` and `url`.
const nodeStubs = {
  name: 'node-stubs',
  setup(build) {
    build.onResolve({ filter: /^(events|url)$/ }, () => ({ path: join(here, 'src/node-stub.js') }));
  },
};

mkdirSync(out, { recursive: true });
const result = await esbuild.build({
  entryPoints: [join(here, 'src/orapo-viewer.js')],
  bundle: true,
  minify: true,
  format: 'iife',
  target: ['chrome109', 'firefox115', 'safari16'],
  legalComments: 'none', // the licences go, whole, into THIRD_PARTY_LICENSES.txt
  define: { 'process.env.NODE_ENV': '"production"' },
  plugins: [nodeStubs],
  metafile: true,
  logLevel: 'warning',
  write: false,
});

// Which packages the bundle holds: from esbuild's own account of its inputs.
const packages = new Map();
for (const input of Object.keys(result.metafile.inputs)) {
  const m = input.match(/node_modules\/((?:@[^/]+\/)?[^/]+)\//);
  if (m) packages.set(m[1], join(here, 'node_modules', m[1]));
}
// Each package's own licence file; for the few that ship none, the text kept in licenses/ (where it came from is
// written at its top). A package with neither stops the build.
const LICENSE_FILE = /^(licen[cs]e|copying|notice)(\.(md|txt))?$/i;
const missing = [];
const sections = [...packages].sort().map(([name, dir]) => {
  const meta = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
  const texts = readdirSync(dir).filter((f) => LICENSE_FILE.test(f)).map((f) => readFileSync(join(dir, f), 'utf8').trim());
  const kept = join(here, 'licenses', `${name.replace('/', '__')}.txt`);
  if (!texts.length && existsSync(kept)) texts.push(readFileSync(kept, 'utf8').trim());
  if (!texts.length) missing.push(name);
  return `${name}@${meta.version} (${meta.license})\n${'-'.repeat(60)}\n${texts.join('\n\n')}\n`;
});
if (missing.length) throw new Error(`no licence text for ${missing.join(', ')}: add it as licenses/<name, / as __>.txt`);

const script = result.outputFiles[0].contents;
const version = createHash('sha256').update(script).digest('hex').slice(0, 12);
const banner = `/*! orapo-viewer ${pkg.version} (${version}): Cornerstone3D ${pkg.dependencies['@cornerstonejs/core']} `
  + 'and its dependencies, MIT, BSD-3-Clause and others; licences in THIRD_PARTY_LICENSES.txt next to this file. */\n';
writeFileSync(join(out, 'orapo-viewer.js'), banner + Buffer.from(script).toString('utf8'));
writeFileSync(join(out, 'THIRD_PARTY_LICENSES.txt'),
  `The packages bundled into orapo-viewer.js (built by \`make viewer\` from viewer/package-lock.json).\n\n${sections.join('\n')}`);
console.log(`orapo-viewer.js: ${(script.length / 1e6).toFixed(2)} MB, ${packages.size} packages`);
