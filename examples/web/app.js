// The page of examples/web: loads the model with ONNX Runtime Web (its WebGPU execution
// provider where the browser offers a WebGPU adapter, WebAssembly on one thread otherwise)
// and generates after the prompt as it is typed. gmlp.js does the decoding; this file
// wires the controls. See docs/web.md.
//
// Query string (all optional): model=URL (default model.onnx), sampling=greedy|top-k, k,
// temperature, seed, max=NEW_TOKENS, prompt=TEXT, backend=wasm (WebAssembly even where
// WebGPU is offered).
//
// #output carries what a test reads: data-state (loading | running | done | error),
// data-prompt (the prompt generated for), data-settings, data-tokens (the generated token
// ids, comma-separated), data-runs (generations started since the page loaded) and
// data-backend (webgpu | wasm).
import { Generator, Sampler } from "./gmlp.js";

const $ = (id) => document.getElementById(id);
const promptBox = $("prompt");
const output = $("output");
const status = $("status");
const query = new URLSearchParams(location.search);

// "webgpu" where the browser offers a WebGPU adapter (and ?backend=wasm does not ask
// otherwise), else "wasm".
async function pickBackend() {
  if (query.get("backend") === "wasm" || !navigator.gpu) return "wasm";
  try {
    return (await navigator.gpu.requestAdapter()) ? "webgpu" : "wasm";
  } catch {
    return "wasm";
  }
}

const backend = await pickBackend();
// The WebGPU build also runs on WebAssembly, but is larger: each backend loads its own.
const ort = await import(backend === "webgpu" ? "./ort/ort.webgpu.min.mjs" : "./ort/ort.wasm.min.mjs");
ort.env.wasm.numThreads = 1; // no cross-origin isolation needed
ort.env.wasm.proxy = false;
const labels = { webgpu: "WebGPU", wasm: "WebAssembly, one thread" };
let backendLabel = labels[backend];
output.dataset.backend = backend;

function setStatus(text, error = false) {
  status.textContent = text;
  status.className = error ? "error" : "";
}

// Query string → controls.
for (const [param, id] of [["k", "k"], ["temperature", "temperature"], ["seed", "seed"], ["max", "max-new"]]) {
  if (query.has(param)) $(id).value = query.get(param);
}
if (query.get("sampling") === "top-k") {
  document.querySelector("input[name=sampling][value=top-k]").checked = true;
}

// The sampling settings of the controls; throws a one-line reason for a bad value.
function settings() {
  const topK = document.querySelector("input[name=sampling]:checked").value === "top-k";
  const number = (id) => ($(id).value.trim() === "" ? null : Number($(id).value));
  const seedText = $("seed").value.trim() || "0";
  if (!/^[0-9]+$/.test(seedText) || BigInt(seedText) >= 2n ** 64n) {
    throw new Error("the seed must be a whole number from 0 to 2^64 - 1");
  }
  const maxNew = number("max-new");
  if (maxNew != null && !(Number.isInteger(maxNew) && maxNew >= 1)) {
    throw new Error("new tokens must be a whole number of at least 1");
  }
  const seed = BigInt(seedText);
  const sampler = topK
    ? { topK: number("k"), temperature: number("temperature"), seed }
    : { topK: null, temperature: 0, seed };
  const label = topK ? `top-k ${sampler.topK}, temperature ${sampler.temperature}, seed ${seed}` : "greedy";
  return { sampler, maxNew, label };
}

const decoder = new TextDecoder(); // invalid UTF-8 (a cut multi-byte character) shows as U+FFFD

let generator = null;
let latest = 0; // the newest request; older runs stop at their next token
let queue = Promise.resolve();
let runs = 0;

async function generate(id) {
  if (id !== latest) return;
  output.dataset.runs = String(++runs);
  const text = promptBox.value;
  const [promptSpan, generatedSpan] = output.children;
  promptSpan.textContent = text;
  generatedSpan.textContent = "";
  $("tokens").textContent = "";
  Object.assign(output.dataset, { state: "running", prompt: text, settings: "", tokens: "" });
  if (text === "") {
    output.dataset.state = "idle";
    setStatus("Type a prompt.");
    return;
  }
  let plan;
  let sampler;
  let label;
  try {
    const chosen = settings();
    label = chosen.label;
    output.dataset.settings = label;
    plan = generator.plan(text, chosen.maxNew);
    sampler = new Sampler(chosen.sampler);
  } catch (err) {
    output.dataset.state = "error";
    setStatus(err.message, true);
    return;
  }
  const tokens = [];
  const steps = [];
  let prefill = 0;
  setStatus(`Generating ${plan.count} tokens (${label})…`);
  for await (const { token, ms } of generator.generate(plan.prompt, plan.count, sampler)) {
    if (id !== latest) return; // a newer prompt or setting: leave the loop, drop this run
    tokens.push(token);
    if (tokens.length === 1) prefill = ms;
    else steps.push(ms);
    generatedSpan.textContent = decoder.decode(new Uint8Array(tokens));
    $("tokens").textContent = `tokens: ${tokens.join(",")}`;
    output.dataset.tokens = tokens.join(",");
  }
  const perStep = steps.length ? `, ${steps.length} steps of ${(steps.reduce((a, b) => a + b, 0) / steps.length).toFixed(1)} ms` : "";
  setStatus(`${tokens.length} tokens (${label}): prompt of ${plan.prompt.length} bytes in ${prefill.toFixed(1)} ms${perStep}; ONNX Runtime Web ${ort.env.versions.web ?? ""}, ${backendLabel}.`);
  output.dataset.state = "done";
}

function request() {
  const id = ++latest;
  queue = queue
    .then(() => generate(id))
    .catch((err) => {
      if (id !== latest) return;
      output.dataset.state = "error";
      setStatus(`generation failed: ${err.message}`, true);
    });
}

let timer = null;
function requestSoon() {
  clearTimeout(timer);
  timer = setTimeout(request, 120);
}

async function main() {
  const url = query.get("model") || "model.onnx";
  output.dataset.state = "loading";
  try {
    const response = await fetch(url);
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status} (see docs/web.md to prepare the folder)`);
    const bytes = new Uint8Array(await response.arrayBuffer());
    try {
      generator = await Generator.load(ort, bytes, [backend]);
    } catch (err) {
      if (backend !== "webgpu") throw err;
      // A file the WebGPU provider refuses (e.g. f16 where the adapter has no shader-f16):
      // the same build runs it on WebAssembly.
      generator = await Generator.load(ort, bytes, ["wasm"]);
      output.dataset.backend = "wasm";
      backendLabel = `${labels.wasm} (WebGPU refused the model: ${err.message})`;
    }
    const { n, state } = generator.info;
    $("model").textContent = `${url}: ${(bytes.length / 1e6).toFixed(1)} MB, byte tokens, up to ${n} positions, ${state.length} state tensors fed back (${state.map((s) => s.past).join(", ")}); ONNX Runtime Web on ${backendLabel}.`;
  } catch (err) {
    output.dataset.state = "error";
    $("model").textContent = `Could not load ${url}.`;
    setStatus(err.message, true);
    return;
  }
  output.dataset.state = "idle";
  promptBox.disabled = false;
  promptBox.addEventListener("input", requestSoon);
  for (const el of document.querySelectorAll("fieldset input")) el.addEventListener("change", request);
  if (query.has("prompt")) {
    promptBox.value = query.get("prompt");
    request();
  } else {
    setStatus("Type a prompt.");
  }
  promptBox.focus();
}

main();
