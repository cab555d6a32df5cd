// Headless Chromium for the browser tests (tests/consumers/runners/ort_web.js, tests/web/):
// a static server on 127.0.0.1 and Debian's Chromium driven by puppeteer-core (npm).
//
// Chromium is started with the flags this closed network needs: without the
// background-networking ones it keeps trying (and failing) to reach Google's hosts. Each
// launch gets a fresh, empty profile directory, removed on close.
"use strict";
const fs = require("fs");
const http = require("http");
const os = require("os");
const path = require("path");

const CHROMIUM = process.env.GMLP_CHROMIUM || "/usr/bin/chromium";
// (puppeteer adds --headless and --user-data-dir itself, from the launch options.)
const FLAGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-dev-shm-usage",
];

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".json": "application/json",
  ".wasm": "application/wasm",
  ".png": "image/png",
};

// Serves exactly the files of `routes` ({"/url/path": "/file/path" or {html: "..."}}, looked
// up at each request) on 127.0.0.1 at a free port; "/" is "/index.html". Anything else is
// 404. Responses are not cached unless `cacheable(urlPath)` says so.
function serve(routes, cacheable = () => false) {
  const server = http.createServer((req, res) => {
    const urlPath = decodeURIComponent(new URL(req.url, "http://127.0.0.1").pathname);
    const file = routes[urlPath === "/" ? "/index.html" : urlPath];
    if (file && typeof file === "object") {
      res.writeHead(200, { "Content-Type": TYPES[".html"], "Cache-Control": "no-store" });
      res.end(file.html);
      return;
    }
    if (!file || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
      res.writeHead(404, { "Content-Type": "text/plain" });
      res.end(`not found: ${urlPath}\n`);
      return;
    }
    const type = TYPES[path.extname(file)] || "application/octet-stream";
    const cache = cacheable(urlPath) ? "max-age=86400, immutable" : "no-store";
    res.writeHead(200, { "Content-Type": type, "Cache-Control": cache });
    fs.createReadStream(file).pipe(res);
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      resolve({ server, base: `http://127.0.0.1:${server.address().port}` });
    });
  });
}

// Every file under `dir` as a route ("/sub/file" → dir/sub/file).
function directoryRoutes(dir) {
  const routes = {};
  const walk = (sub) => {
    for (const entry of fs.readdirSync(path.join(dir, sub), { withFileTypes: true })) {
      const rel = path.posix.join(sub, entry.name);
      if (entry.isDirectory()) walk(rel);
      else if (entry.isFile()) routes["/" + rel] = path.join(dir, rel);
    }
  };
  walk("");
  return routes;
}

// With WebGPU: no --disable-gpu, and the flag that exposes WebGPU where Chromium would not
// (Linux, headless): its adapter is then SwiftShader's, on the CPU, no GPU needed.
const WEBGPU_FLAGS = ["--enable-unsafe-webgpu"];

// Launches Chromium with puppeteer-core from `modules` (a node_modules folder), with
// WebGPU when `webgpu` is set (otherwise the GPU is disabled and pages see no adapter).
// Returns {browser, close}; close() also removes the profile directory.
async function launch(modules, { webgpu = false } = {}) {
  const puppeteer = require(path.join(modules, "puppeteer-core"));
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "gmlp-chromium-"));
  let browser;
  try {
    browser = await puppeteer.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: webgpu ? FLAGS.filter((f) => f !== "--disable-gpu").concat(WEBGPU_FLAGS) : FLAGS,
      userDataDir: profile,
      // DevTools over a pipe instead of a port: Chromium (which puppeteer starts in a process
      // group of its own) exits when this process does, however it ends.
      pipe: true,
    });
  } catch (err) {
    fs.rmSync(profile, { recursive: true, force: true });
    throw err;
  }
  const close = async () => {
    try {
      await browser.close();
    } finally {
      fs.rmSync(profile, { recursive: true, force: true });
    }
  };
  return { browser, close };
}

// The browser's own version string ("Chrome/156.0.8078.79" in headless mode).
async function browserVersion(modules, options = {}) {
  const { browser, close } = await launch(modules, options);
  try {
    return await browser.version();
  } finally {
    await close();
  }
}

// One line of text from an error, whitespace collapsed.
function oneLine(err) {
  return String(err && err.message ? err.message : err).split(/\s+/).join(" ");
}

module.exports = { CHROMIUM, serve, directoryRoutes, launch, browserVersion, oneLine };
