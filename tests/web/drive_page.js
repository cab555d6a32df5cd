// Opens the examples/web page in headless Chromium, types a prompt as a user would and
// reads back what the page generated (tests/external/web.rs).
// Usage: node drive_page.js NODE_MODULES SITE_DIR SPEC_JSON
//   NODE_MODULES: puppeteer-core (scripts/consumers_setup.sh); SITE_DIR: a folder made by
//   examples/web/prepare.sh, served here with `python3 -m http.server` on 127.0.0.1 (the
//   command docs/web.md gives; PYTHON overrides the interpreter);
//   SPEC_JSON: {"prompt": TEXT, "out": RESULT.json, "webgpu": BOOL,
//               "runs": [{"name": N, "query": "sampling=top-k&k=5", "screenshot": PNG}]}.
//   "webgpu": Chromium offers the page a WebGPU adapter (SwiftShader's where there is no
//   GPU); otherwise it has none and the page runs on WebAssembly.
// RESULT.json: {"runs": [{"name", "tokens": [ids], "settings", "status", "model",
//                         "generations": how many generations the page started,
//                         "backend": "webgpu" or "wasm", as the page chose}]}.
// Keys are typed slower than the page's 120 ms pause, so it generates as the prompt grows.
// On failure prints one line to stderr, exits 1.
"use strict";
const fs = require("fs");
const { spawn } = require("child_process");
const path = require("path");
const { launch, oneLine } = require(path.join(__dirname, "..", "consumers", "runners", "browser.js"));

const LOAD_TIMEOUT_MS = 120000;
const GENERATE_TIMEOUT_MS = 120000;
const KEY_DELAY_MS = 200;

// `python3 -m http.server 0` and the port it chose (read from its first line).
function startServer(site) {
  const python = process.env.PYTHON || "python3";
  const child = spawn(python, ["-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", site], {
    stdio: ["ignore", "pipe", "ignore"],
  });
  return new Promise((resolve, reject) => {
    let seen = "";
    const timer = setTimeout(() => reject(new Error(`http.server printed no port: ${seen}`)), 30000);
    child.once("error", reject);
    child.once("exit", (code) => reject(new Error(`http.server exited (${code}): ${seen}`)));
    child.stdout.on("data", (chunk) => {
      seen += chunk;
      const m = /port (\d+)/.exec(seen);
      if (m) {
        clearTimeout(timer);
        child.removeAllListeners("exit");
        resolve({ child, base: `http://127.0.0.1:${m[1]}` });
      }
    });
  });
}

async function drive(browser, base, prompt, run) {
  const page = await browser.newPage();
  const log = [];
  page.on("console", (m) => log.push(m.text()));
  page.on("pageerror", (e) => log.push(oneLine(e)));
  await page.setViewport({ width: 960, height: 640 });
  await page.goto(`${base}/${run.query ? "?" + run.query : ""}`);
  const loaded = await page
    .waitForFunction(
      () => !document.getElementById("prompt").disabled || document.getElementById("output").dataset.state === "error",
      { timeout: LOAD_TIMEOUT_MS },
    )
    .catch((e) => e);
  const statusText = () => page.$eval("#status", (el) => el.textContent);
  if (loaded instanceof Error || (await page.$eval("#output", (el) => el.dataset.state)) === "error") {
    throw new Error(`${run.name}: the page did not load the model: ${await statusText()} ${log.join(" | ")}`);
  }
  await page.click("#prompt");
  await page.type("#prompt", prompt, { delay: KEY_DELAY_MS });
  const finished = await page
    .waitForFunction(
      (p) => {
        const d = document.getElementById("output").dataset;
        return (d.state === "done" && d.prompt === p) || d.state === "error";
      },
      { timeout: GENERATE_TIMEOUT_MS },
      prompt,
    )
    .catch((e) => e);
  const data = await page.$eval("#output", (el) => ({ ...el.dataset }));
  if (finished instanceof Error || data.state !== "done") {
    throw new Error(`${run.name}: no generation for the prompt (state ${data.state}): ${await statusText()} ${log.join(" | ")}`);
  }
  if (run.screenshot) await page.screenshot({ path: run.screenshot, fullPage: true });
  const result = {
    name: run.name,
    tokens: data.tokens === "" ? [] : data.tokens.split(",").map(Number),
    settings: data.settings,
    status: await statusText(),
    model: await page.$eval("#model", (el) => el.textContent),
    generations: Number(data.runs || 0),
    backend: data.backend,
  };
  await page.close();
  return result;
}

async function main(argv) {
  const [modules, site, specJson] = argv.slice(2, 5);
  const spec = JSON.parse(specJson);
  const { child, base } = await startServer(site);
  let browser = null;
  try {
    browser = await launch(modules, { webgpu: Boolean(spec.webgpu) });
    const runs = [];
    for (const run of spec.runs) runs.push(await drive(browser.browser, base, spec.prompt, run));
    fs.writeFileSync(spec.out, JSON.stringify({ runs }, null, 1));
    return 0;
  } finally {
    if (browser) await browser.close();
    child.kill();
  }
}

main(process.argv).then(
  (code) => process.exit(code),
  (err) => {
    console.error(oneLine(err));
    process.exit(1);
  },
);
