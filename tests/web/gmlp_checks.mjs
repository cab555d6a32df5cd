// Checks examples/web/gmlp.js outside the browser (tests/external/web.rs): the metadata reader on
// real files, its refusals, the prompt checks, and the SplitMix64 stream against the Rust
// one. Usage: node gmlp_checks.mjs GMLP_JS SPEC_JSON
//   SPEC_JSON: {"with_past": F, "variable": F, "vision": F, "vocab300": F,
//               "stream": {"seed": S, "key": K, "values": ["u64 as decimal", ...]}}
// Prints what it checked; on a failed check prints it to stderr and exits 1.
import fs from "node:fs";
import { pathToFileURL } from "node:url";

const [gmlpJs, specJson] = process.argv.slice(2, 4);
const { decodingInfo, Generator, SplitMix64 } = await import(pathToFileURL(gmlpJs).href);
const spec = JSON.parse(specJson);
const read = (f) => new Uint8Array(fs.readFileSync(f));
let checked = 0;

function check(what, ok, detail = "") {
  if (!ok) {
    console.error(`gmlp_checks: ${what} failed ${detail}`);
    process.exit(1);
  }
  checked += 1;
  console.log(`ok: ${what}`);
}

function refuses(what, fn, pattern) {
  try {
    fn();
  } catch (err) {
    check(what, pattern.test(err.message), `(message: ${err.message})`);
    return;
  }
  check(what, false, "(no error)");
}

const info = decodingInfo(read(spec.with_past));
check("with-past model: n, vocabulary", info.n === 32 && info.vocab === 256, JSON.stringify(info));
check("a plain --with-past: static state (position input, n rows)", info.fixed === true, JSON.stringify(info));
check(
  "with-past model: state in graph order",
  info.state.map((s) => `${s.past}/${s.present}/${s.width}`).join(" ") ===
    "past_sgu.0/present_sgu.0/48 past_key.0/present_key.0/16 past_value.0/present_value.0/16 " +
      "past_sgu.1/present_sgu.1/48 past_key.1/present_key.1/16 past_value.1/present_value.1/16",
  JSON.stringify(info.state),
);
refuses("variable-length model refused", () => decodingInfo(read(spec.variable)), /rebuild it with --with-past/);
refuses("vision model refused", () => decodingInfo(read(spec.vision)), /no gmlp_onnx\.decoding metadata/);
refuses("300-token model refused", () => decodingInfo(read(spec.vocab300)), /bytes \(256 tokens\); this model has 300 tokens/);
const whole = read(spec.with_past);
refuses("truncated file refused", () => decodingInfo(whole.subarray(0, whole.length - 7)), /truncated|not an ONNX file/);
refuses("not an ONNX file refused", () => decodingInfo(new TextEncoder().encode("<html>404</html>")), /truncated|not an ONNX file/);

const g = new Generator(null, null, info);
refuses("empty prompt refused", () => g.plan(""), /the prompt is empty/);
refuses("prompt over n refused", () => g.plan("é".repeat(17)), /34 bytes, more than the model's 32 positions/);
refuses("too many new tokens refused", () => g.plan("abc", 30), /room for 29/);
const plan = g.plan("Hé");
check("prompt bytes and default count", plan.prompt.join(",") === "72,195,169" && plan.count === 29, JSON.stringify(plan));

const rng = SplitMix64.keyed(BigInt(spec.stream.seed), spec.stream.key);
const values = spec.stream.values.map(() => rng.nextU64().toString());
check("SplitMix64 stream equals src/rng.rs", values.join(",") === spec.stream.values.join(","), values.join(","));
console.log(`gmlp_checks: ${checked} checks passed`);
