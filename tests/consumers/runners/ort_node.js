// Runs an ONNX file in onnxruntime-node for the consumer matrix (tests/external/consumers.rs).
// Usage: node ort_node.js NODE_MODULES MODEL.onnx INPUTS.json OUTPUTS.json
//        node ort_node.js NODE_MODULES --version
// INPUTS.json: {name: {type: "float32"|"int64", dims: [...], data: [...]}}; OUTPUTS.json has
// the same form for every graph output. On failure prints one line to stderr, exits 1.
"use strict";
const fs = require("fs");
const path = require("path");

async function main(argv) {
  const modules = argv[2];
  if (argv[3] === "--version") {
    const pkg = JSON.parse(fs.readFileSync(path.join(modules, "onnxruntime-node", "package.json"), "utf8"));
    console.log(pkg.version);
    return 0;
  }
  const [model, inputsFile, outputsFile] = argv.slice(3, 6);
  const ort = require(path.join(modules, "onnxruntime-node"));
  const inputs = JSON.parse(fs.readFileSync(inputsFile, "utf8"));
  const feeds = {};
  for (const [name, t] of Object.entries(inputs)) {
    const data = t.type === "int64" ? BigInt64Array.from(t.data.map(BigInt)) : Float32Array.from(t.data);
    feeds[name] = new ort.Tensor(t.type, data, t.dims);
  }
  const session = await ort.InferenceSession.create(model);
  const results = await session.run(feeds);
  const out = {};
  for (const name of session.outputNames) {
    const t = results[name];
    out[name] = { type: t.type, dims: t.dims, data: Array.from(t.data, Number) };
  }
  fs.writeFileSync(outputsFile, JSON.stringify(out));
  return 0;
}

main(process.argv).then(
  (code) => process.exit(code),
  (err) => {
    console.error(String(err && err.message ? err.message : err).split(/\s+/).join(" "));
    process.exit(1);
  }
);
