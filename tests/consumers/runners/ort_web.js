// Runs ONNX files in onnxruntime-web (WASM backend, one thread) inside headless Chromium,
// for the consumer matrix (tests/external/consumers.rs).
// Usage: node ort_web.js NODE_MODULES MODEL.onnx INPUTS.json OUTPUTS.json   (one file)
//        node ort_web.js NODE_MODULES --serve      (one browser for many files, see below)
//        node ort_web.js NODE_MODULES --version
// NODE_MODULES holds onnxruntime-web and puppeteer-core (scripts/consumers_setup.sh); the
// browser is GMLP_CHROMIUM or /usr/bin/chromium. The model, the inputs and ONNX Runtime
// Web's dist files are served on 127.0.0.1; a fresh page loads the model over HTTP, runs it
// and hands the outputs back to this script. INPUTS.json / OUTPUTS.json have the form of
// ort_node.js's. On failure prints one line to stderr, exits 1.
//
// --serve: starts Chromium once, then reads one job a line on stdin,
// {"model": M, "inputs": I, "outputs": O}, and answers each with one line on stdout,
// {"ok": true} or {"ok": false, "error": "..."}; each job gets its own page (its own
// WebAssembly instance and session). Exits when stdin closes.
"use strict";
const fs = require("fs");
const path = require("path");
const readline = require("readline");
const { serve, launch, browserVersion, oneLine } = require("./browser.js");

// The WASM-only ES module build and the WebAssembly binary it loads from beside itself.
const ORT_FILES = ["ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm"];

// Runs in the page: creates the session from `modelUrl`, feeds `inputsUrl`, returns
// {outputs} or {error}. float16 outputs come back as numbers.
async function runInPage(modelUrl, inputsUrl) {
  try {
    const ort = await import("/ort/ort.wasm.min.mjs");
    ort.env.wasm.numThreads = 1;
    ort.env.wasm.proxy = false;
    const get = async (url) => {
      const response = await fetch(url);
      if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
      return response;
    };
    const model = new Uint8Array(await (await get(modelUrl)).arrayBuffer());
    const inputs = await (await get(inputsUrl)).json();
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

// A static server for the dist files and the jobs' files, and a browser.
async function start(modules) {
  const dist = path.join(modules, "onnxruntime-web", "dist");
  const routes = {
    // An empty page of the same origin for the module import.
    "/index.html": { html: "<!doctype html><title>onnxruntime-web consumer</title>\n" },
  };
  for (const f of ORT_FILES) routes["/ort/" + f] = path.join(dist, f);
  // The dist files may stay in the browser's cache (with the compiled WebAssembly) from one
  // job to the next; a job's files have URLs of their own.
  const { server, base } = await serve(routes, (p) => p.startsWith("/ort/"));
  let browser;
  try {
    browser = await launch(modules);
  } catch (err) {
    server.close();
    throw err;
  }
  let jobs = 0;
  // Runs one file; resolves to null or the error's one-line message.
  const run = async (model, inputsFile, outputsFile) => {
    const job = `/job${++jobs}`;
    routes[`${job}/model.onnx`] = model;
    routes[`${job}/inputs.json`] = inputsFile;
    const page = await browser.browser.newPage();
    try {
      await page.goto(base + "/index.html");
      const result = await page.evaluate(runInPage, `${job}/model.onnx`, `${job}/inputs.json`);
      if (result.error) return oneLine(result.error);
      fs.writeFileSync(outputsFile, JSON.stringify(result.outputs));
      return null;
    } finally {
      delete routes[`${job}/model.onnx`];
      delete routes[`${job}/inputs.json`];
      await page.close().catch(() => {});
    }
  };
  const stop = async () => {
    try {
      await browser.close();
    } finally {
      server.close();
    }
  };
  return { run, stop };
}

async function main(argv) {
  const modules = argv[2];
  if (argv[3] === "--version") {
    const pkg = JSON.parse(fs.readFileSync(path.join(modules, "onnxruntime-web", "package.json"), "utf8"));
    const chrome = (await browserVersion(modules)).replace(/^[^/]*\//, "");
    console.log(`${pkg.version} (Chromium ${chrome})`);
    return 0;
  }
  const { run, stop } = await start(modules);
  try {
    if (argv[3] === "--serve") {
      for await (const line of readline.createInterface({ input: process.stdin })) {
        if (!line.trim()) continue;
        let error;
        try {
          const job = JSON.parse(line);
          error = await run(job.model, job.inputs, job.outputs);
        } catch (err) {
          error = oneLine(err);
        }
        process.stdout.write(JSON.stringify(error === null ? { ok: true } : { ok: false, error }) + "\n");
      }
      return 0;
    }
    const [model, inputsFile, outputsFile] = argv.slice(3, 6);
    const error = await run(model, inputsFile, outputsFile);
    if (error !== null) throw new Error(error);
    return 0;
  } finally {
    await stop();
  }
}

main(process.argv).then(
  (code) => process.exit(code),
  (err) => {
    console.error(oneLine(err));
    process.exit(1);
  }
);
