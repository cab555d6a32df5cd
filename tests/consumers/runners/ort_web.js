// Runs an ONNX file in onnxruntime-web (WASM backend, one thread) inside headless Chromium,
// for the consumer matrix (tests/consumers.rs).
// Usage: node ort_web.js NODE_MODULES MODEL.onnx INPUTS.json OUTPUTS.json
//        node ort_web.js NODE_MODULES --version
// NODE_MODULES holds onnxruntime-web and puppeteer-core (scripts/consumers_setup.sh); the
// browser is GMLP_CHROMIUM or /usr/bin/chromium. The model, the inputs and ONNX Runtime
// Web's dist files are served on 127.0.0.1; the page loads the model over HTTP, runs it and
// hands the outputs back to this script. INPUTS.json / OUTPUTS.json have the form of
// ort_node.js's. On failure prints one line to stderr, exits 1.
"use strict";
const fs = require("fs");
const path = require("path");
const { serve, launch, browserVersion, oneLine } = require("./browser.js");

// The WASM-only ES module build and the WebAssembly binary it loads from beside itself.
const ORT_FILES = ["ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm"];

// Runs in the page: creates the session from /model.onnx, feeds /inputs.json, returns
// {outputs} or {error}. float16 outputs come back as numbers.
async function runInPage() {
  try {
    const ort = await import("/ort/ort.wasm.min.mjs");
    ort.env.wasm.numThreads = 1;
    ort.env.wasm.proxy = false;
    const model = new Uint8Array(await (await fetch("/model.onnx")).arrayBuffer());
    const inputs = await (await fetch("/inputs.json")).json();
    const session = await ort.InferenceSession.create(model, { executionProviders: ["wasm"] });
    const feeds = {};
    for (const [name, t] of Object.entries(inputs)) {
      const data = t.type === "int64" ? BigInt64Array.from(t.data.map(BigInt)) : Float32Array.from(t.data);
      feeds[name] = new ort.Tensor(t.type, data, t.dims);
    }
    const results = await session.run(feeds);
    const half = (h) => {
      const sign = h & 0x8000 ? -1 : 1;
      const exp = (h >> 10) & 0x1f;
      const frac = h & 0x3ff;
      if (exp === 0) return sign * frac * 2 ** -24;
      if (exp === 31) return frac ? NaN : sign * Infinity;
      return sign * (1 + frac / 1024) * 2 ** (exp - 15);
    };
    const outputs = {};
    for (const name of session.outputNames) {
      const t = results[name];
      const f16bits = t.type === "float16" && t.data instanceof Uint16Array;
      const data = Array.from(t.data, (v) => (f16bits ? half(v) : Number(v)));
      outputs[name] = { type: t.type, dims: Array.from(t.dims), data };
    }
    await session.release();
    return { outputs };
  } catch (err) {
    return { error: String(err && err.message ? err.message : err) };
  }
}

async function main(argv) {
  const modules = argv[2];
  if (argv[3] === "--version") {
    const pkg = JSON.parse(fs.readFileSync(path.join(modules, "onnxruntime-web", "package.json"), "utf8"));
    const chrome = (await browserVersion(modules)).replace(/^[^/]*\//, "");
    console.log(`${pkg.version} (Chromium ${chrome})`);
    return 0;
  }
  const [model, inputsFile, outputsFile] = argv.slice(3, 6);
  const dist = path.join(modules, "onnxruntime-web", "dist");
  const routes = {
    // An empty page of the same origin for the module import.
    "/index.html": { html: "<!doctype html><title>onnxruntime-web consumer</title>\n" },
    "/model.onnx": model,
    "/inputs.json": inputsFile,
  };
  for (const f of ORT_FILES) routes["/ort/" + f] = path.join(dist, f);
  const { server, base } = await serve(routes);
  const { browser, close } = await launch(modules);
  try {
    const page = await browser.newPage();
    const log = [];
    page.on("console", (m) => log.push(m.text()));
    page.on("pageerror", (e) => log.push(oneLine(e)));
    await page.goto(base + "/index.html");
    const result = await page.evaluate(runInPage);
    if (result.error) {
      // The page's console first (ONNX Runtime's own log lines), the error last.
      for (const line of log) console.error(line);
      throw new Error(result.error);
    }
    fs.writeFileSync(outputsFile, JSON.stringify(result.outputs));
    return 0;
  } finally {
    await close();
    server.close();
  }
}

main(process.argv).then(
  (code) => process.exit(code),
  (err) => {
    console.error(oneLine(err));
    process.exit(1);
  }
);
