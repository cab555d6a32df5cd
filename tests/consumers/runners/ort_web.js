// Runs ONNX files in onnxruntime-web inside headless Chromium, for the consumer matrix
// (tests/external/consumers.rs): on its WASM backend (one thread), or with `--ep webgpu` on
// its WebGPU execution provider (the ort.webgpu build; Chromium started with WebGPU, whose
// adapter is SwiftShader's where there is no GPU), which leaves to its CPU provider the
// nodes it has no kernel for. ONNX Runtime's verbose log says where each node went: every
// WebGPU answer carries the nodes it placed on the CPU.
// Usage: node ort_web.js NODE_MODULES [--ep webgpu] MODEL.onnx INPUTS.json OUTPUTS.json
//        node ort_web.js NODE_MODULES [--ep webgpu] --serve   (one browser, many files)
//        node ort_web.js NODE_MODULES [--ep webgpu] --version
// NODE_MODULES holds onnxruntime-web and puppeteer-core (scripts/consumers_setup.sh); the
// browser is GMLP_CHROMIUM or /usr/bin/chromium. The model, the inputs and ONNX Runtime
// Web's dist files are served on 127.0.0.1; a fresh page loads the model over HTTP, runs it
// and hands the outputs back to this script. INPUTS.json / OUTPUTS.json have the form of
// ort_node.js's. On failure prints one line to stderr, exits 1.
//
// --serve: starts Chromium once, then reads one job a line on stdin,
// {"model": M, "inputs": I, "outputs": O}, and answers each with one line on stdout,
// {"ok": true} or {"ok": false, "error": "..."}; each job gets its own page (its own
// WebAssembly instance and session). With WebGPU a passing answer also has "nodes" (how
// many the session ran) and "cpu_nodes" (those placed on the CPU provider, "Op (name)").
// Exits when stdin closes.
"use strict";
const fs = require("fs");
const path = require("path");
const readline = require("readline");
const { serve, launch, browserVersion, oneLine } = require("./browser.js");

// Per backend: the ES module build and the WebAssembly binary it loads from beside itself.
const BUILDS = {
  wasm: ["ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm"],
  webgpu: ["ort.webgpu.min.mjs", "ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm"],
};

// Runs in the page: creates the session from `modelUrl` on `ep` ("wasm" or "webgpu"),
// feeds `inputsUrl`, returns {outputs} or {error}. float16 outputs come back as numbers.
// With WebGPU the session logs verbosely (the node placements, read by the caller).
async function runInPage(modelUrl, inputsUrl, ep, build) {
  try {
    if (ep === "webgpu") {
      const adapter = navigator.gpu && (await navigator.gpu.requestAdapter());
      if (!adapter) throw new Error("this browser offers no WebGPU adapter");
    }
    const ort = await import("/ort/" + build);
    ort.env.wasm.numThreads = 1;
    ort.env.wasm.proxy = false;
    if (ep === "webgpu") ort.env.logLevel = "verbose";
    const get = async (url) => {
      const response = await fetch(url);
      if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
      return response;
    };
    const model = new Uint8Array(await (await get(modelUrl)).arrayBuffer());
    const inputs = await (await get(inputsUrl)).json();
    const options = ep === "webgpu" ? { logSeverityLevel: 0, logVerbosityLevel: 0 } : {};
    const session = await ort.InferenceSession.create(model, { executionProviders: [ep], ...options });
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

// ONNX Runtime's node placements in a session's verbose log: {nodes, cpu_nodes} (the
// nodes placed on the CPU provider as "Op (name)"), or null when the log has none.
function placements(lines) {
  let nodes = 0;
  let found = false;
  const cpu = [];
  let current = null;
  for (const line of lines) {
    const all = /All nodes placed on \[(\w+)\]\. Number of nodes: (\d+)/.exec(line);
    const some = /Node\(s\) placed on \[(\w+)\]\. Number of nodes: (\d+)/.exec(line);
    const placed = all || some;
    if (placed) {
      found = true;
      nodes += Number(placed[2]);
      current = placed[1];
      continue;
    }
    const node = /VerifyEachNodeIsAssignedToAnEp\]\s+(\S+ \(.*\))\s*$/.exec(line);
    if (node && current === "CPUExecutionProvider") cpu.push(node[1]);
    else if (!node) current = null;
  }
  return found ? { nodes, cpu_nodes: cpu } : null;
}

// A static server for the dist files and the jobs' files, and a browser.
async function start(modules, ep) {
  const dist = path.join(modules, "onnxruntime-web", "dist");
  const routes = {
    // An empty page of the same origin for the module import.
    "/index.html": { html: "<!doctype html><title>onnxruntime-web consumer</title>\n" },
  };
  for (const f of BUILDS[ep]) routes["/ort/" + f] = path.join(dist, f);
  // The dist files may stay in the browser's cache (with the compiled WebAssembly) from one
  // job to the next; a job's files have URLs of their own.
  const { server, base } = await serve(routes, (p) => p.startsWith("/ort/"));
  let browser;
  try {
    browser = await launch(modules, { webgpu: ep === "webgpu" });
  } catch (err) {
    server.close();
    throw err;
  }
  let jobs = 0;
  // Runs one file; resolves to {error} (one line) or, with WebGPU, its node placements.
  const run = async (model, inputsFile, outputsFile) => {
    const job = `/job${++jobs}`;
    routes[`${job}/model.onnx`] = model;
    routes[`${job}/inputs.json`] = inputsFile;
    const page = await browser.browser.newPage();
    const log = [];
    page.on("console", (m) => log.push(m.text()));
    try {
      await page.goto(base + "/index.html");
      const result = await page.evaluate(runInPage, `${job}/model.onnx`, `${job}/inputs.json`, ep, BUILDS[ep][0]);
      if (result.error) return { error: oneLine(result.error) };
      fs.writeFileSync(outputsFile, JSON.stringify(result.outputs));
      if (ep !== "webgpu") return {};
      const placed = placements(log);
      if (!placed) return { error: "ONNX Runtime logged no node placements (verbose log missing)" };
      return placed;
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
  let args = argv.slice(3);
  let ep = "wasm";
  if (args[0] === "--ep") {
    ep = args[1];
    args = args.slice(2);
    if (!BUILDS[ep]) throw new Error(`--ep ${ep}: wasm or webgpu`);
  }
  if (args[0] === "--version") {
    const pkg = JSON.parse(fs.readFileSync(path.join(modules, "onnxruntime-web", "package.json"), "utf8"));
    const chrome = (await browserVersion(modules)).replace(/^[^/]*\//, "");
    console.log(`${pkg.version} (Chromium ${chrome})`);
    return 0;
  }
  const { run, stop } = await start(modules, ep);
  try {
    if (args[0] === "--serve") {
      for await (const line of readline.createInterface({ input: process.stdin })) {
        if (!line.trim()) continue;
        let answer;
        try {
          const job = JSON.parse(line);
          const result = await run(job.model, job.inputs, job.outputs);
          answer = result.error ? { ok: false, error: result.error } : { ok: true, ...result };
        } catch (err) {
          answer = { ok: false, error: oneLine(err) };
        }
        process.stdout.write(JSON.stringify(answer) + "\n");
      }
      return 0;
    }
    const [model, inputsFile, outputsFile] = args.slice(0, 3);
    const result = await run(model, inputsFile, outputsFile);
    if (result.error) throw new Error(result.error);
    if (result.cpu_nodes) console.log(JSON.stringify(result));
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
