// Text generation with a gmlp-onnx causal token model built `--with-past`, in the browser
// with ONNX Runtime Web. No DOM here (app.js is the page); everything mirrors
// `gmlp-onnx generate` (src/cli/generate.rs, src/generation/sampling.rs, src/rng.rs) so that the
// same model, prompt and settings give the same bytes:
//
// - the prompt is its UTF-8 bytes, one token each (a 256-token vocabulary);
// - the whole prompt runs once with every `past_*` input empty ([1, 0, width], growing state)
//   or n rows of zeros ([1, n, width], static state, with `position` 0); then each picked
//   token runs alone, the `present_*` outputs of the last run fed back as `past_*` (and the
//   static state's `position` advanced by the tokens fed);
// - the next token comes from the last position's logits: the argmax (greedy), or a draw
//   among the k most likely at a temperature from a seeded SplitMix64 stream;
// - generation stops after `maxNew` tokens, by default when the model's n positions are full.

// --- model metadata ----------------------------------------------------------------------

// ModelProto's `metadata_props` (field 14, StringStringEntryProto {key = 1, value = 2}), read
// from the file's bytes by walking the top-level protobuf fields (onnx.proto3). ONNX Runtime
// Web does not expose a model's metadata; this skips every other field by its wire type.
export function readMetadata(bytes) {
  const props = new Map();
  const decoder = new TextDecoder();
  const fields = function* (buf, start, end) {
    let pos = start;
    const varint = () => {
      let value = 0;
      let scale = 1;
      for (;;) {
        if (pos >= end) throw new Error("truncated ONNX file (varint)");
        const b = buf[pos++];
        value += (b & 0x7f) * scale;
        if (b < 0x80) return value;
        scale *= 128;
        if (scale > 2 ** 63) throw new Error("not an ONNX file (varint too long)");
      }
    };
    while (pos < end) {
      const tag = varint();
      const field = Math.floor(tag / 8);
      const wire = tag % 8;
      if (wire === 0) {
        varint();
      } else if (wire === 1 || wire === 5) {
        pos += wire === 1 ? 8 : 4;
      } else if (wire === 2) {
        const len = varint();
        if (pos + len > end) throw new Error("truncated ONNX file (field longer than the file)");
        yield { field, start: pos, end: pos + len };
        pos += len;
      } else {
        throw new Error(`not an ONNX file (wire type ${wire})`);
      }
    }
    if (pos !== end) throw new Error("truncated ONNX file");
  };
  for (const f of fields(bytes, 0, bytes.length)) {
    if (f.field !== 14) continue;
    let key = "";
    let value = "";
    for (const g of fields(bytes, f.start, f.end)) {
      const text = decoder.decode(bytes.subarray(g.start, g.end));
      if (g.field === 1) key = text;
      if (g.field === 2) value = text;
    }
    props.set(key, value);
  }
  return props;
}

// What the page needs from `gmlp_onnx.decoding` and `gmlp_onnx.config` (docs/web.md): n, the
// vocabulary and the state tensors in graph order. Throws a one-line reason for any file
// this page cannot drive.
export function decodingInfo(bytes) {
  const props = readMetadata(bytes);
  const decoding = props.get("gmlp_onnx.decoding");
  const config = props.get("gmlp_onnx.config");
  if (!decoding || !config) {
    throw new Error("not a gmlp-onnx causal token model (no gmlp_onnx.decoding metadata): build it with `gmlp-onnx build --causal --with-past`");
  }
  const info = JSON.parse(decoding);
  const task = JSON.parse(config).task || {};
  const tokens = task.kind === "tokens" ? task : null;
  if (info.mode !== "with-past" && info.mode !== "static") {
    throw new Error(`the model decodes in mode "${info.mode}"; this page feeds state back: rebuild it with --with-past`);
  }
  if (!tokens || tokens.vocab_size !== 256) {
    throw new Error(`the page's tokens are bytes (256 tokens); this model has ${tokens ? `${tokens.vocab_size} tokens` : `no tokens (task ${task.kind})`}`);
  }
  return {
    n: info.max_sequence,
    vocab: tokens.vocab_size,
    // "static": fixed-size state [1, n, width] and a `position` input (docs/static-state.md);
    // "with-past": state that grows by the fed tokens every run (docs/generation.md).
    fixed: info.mode === "static",
    state: info.state.map((s) => ({ past: s.past, present: s.present, width: s.width })),
  };
}

// --- sampling ----------------------------------------------------------------------------

const MASK = (1n << 64n) - 1n;

// SplitMix64 (Steele, Lea, Flood 2014) keyed by a seed and a name (FNV-1a), as src/rng.rs.
export class SplitMix64 {
  constructor(state) {
    this.state = state & MASK;
  }

  static keyed(seed, key) {
    let h = 0xcbf29ce484222325n;
    for (const b of new TextEncoder().encode(key)) {
      h ^= BigInt(b);
      h = (h * 0x100000001b3n) & MASK;
    }
    const rotated = ((h << 17n) | (h >> 47n)) & MASK;
    const s = new SplitMix64(BigInt.asUintN(64, BigInt(seed)) ^ rotated);
    s.nextU64();
    return s;
  }

  nextU64() {
    this.state = (this.state + 0x9e3779b97f4a7c15n) & MASK;
    let z = this.state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK;
    return z ^ (z >> 31n);
  }

  // Uniform in [0, 1) with 53 random bits.
  nextF64() {
    return Number(this.nextU64() >> 11n) * 2 ** -53;
  }
}

// Picks tokens from logits as src/generation/sampling.rs: greedy when the temperature is 0 (the
// default without topK) or topK is 1, else a draw at `temperature` (default 1 with topK)
// among the topK most likely tokens. NaN logits are never picked.
export class Sampler {
  constructor({ temperature = null, topK = null, seed = 0 } = {}) {
    this.temperature = temperature ?? (topK != null ? 1 : 0);
    if (!(Number.isFinite(this.temperature) && this.temperature >= 0)) {
      throw new Error("the temperature must be a finite number >= 0");
    }
    if (topK != null && !(Number.isInteger(topK) && topK >= 1)) {
      throw new Error("top-k must be a whole number of at least 1");
    }
    this.topK = topK;
    this.rng = SplitMix64.keyed(seed, "sampling");
  }

  get greedy() {
    return this.temperature === 0 || this.topK === 1;
  }

  pick(logits) {
    const order = [];
    for (let i = 0; i < logits.length; i++) if (!Number.isNaN(logits[i])) order.push(i);
    // Most likely first (total order: -0 below +0); ties keep the lower id first.
    order.sort((a, b) => {
      const x = logits[a];
      const y = logits[b];
      if (x > y) return -1;
      if (x < y) return 1;
      const nx = Object.is(x, -0);
      const ny = Object.is(y, -0);
      if (nx !== ny) return nx ? 1 : -1;
      return a - b;
    });
    if (order.length === 0) return 0;
    if (this.greedy) return order[0];
    const kept = order.slice(0, Math.min(this.topK ?? order.length, order.length));
    const max = logits[kept[0]];
    const weights = kept.map((i) => Math.exp((logits[i] - max) / this.temperature));
    const total = weights.reduce((sum, w) => sum + w, 0);
    let draw = this.rng.nextF64() * total;
    for (let j = 0; j < kept.length; j++) {
      if (draw < weights[j]) return kept[j];
      draw -= weights[j];
    }
    return kept[kept.length - 1];
  }
}

// --- generation --------------------------------------------------------------------------

// A loaded model: an ONNX Runtime Web session and its decoding description.
export class Generator {
  constructor(ort, session, info) {
    this.ort = ort;
    this.session = session;
    this.info = info;
  }

  // `bytes`: the .onnx file (a single file: external data is not supported here);
  // `executionProviders`: ONNX Runtime Web's, e.g. ["webgpu"] with its WebGPU build.
  static async load(ort, bytes, executionProviders = ["wasm"]) {
    const info = decodingInfo(bytes);
    const session = await ort.InferenceSession.create(bytes, { executionProviders });
    return new Generator(ort, session, info);
  }

  // The prompt's tokens and how many to generate, checked as `gmlp-onnx generate` checks
  // them. Throws a one-line reason.
  plan(promptText, maxNew = null) {
    const prompt = Array.from(new TextEncoder().encode(promptText));
    const n = this.info.n;
    if (prompt.length === 0) throw new Error("the prompt is empty");
    if (prompt.length > n) {
      throw new Error(`the prompt has ${prompt.length} bytes, more than the model's ${n} positions`);
    }
    const room = n - prompt.length;
    if (maxNew != null && maxNew > room) {
      throw new Error(`${maxNew} new tokens would pass the model's ${n} positions (${prompt.length} prompt bytes leave room for ${room})`);
    }
    return { prompt, count: maxNew ?? room };
  }

  // Generates `count` tokens after `prompt` (byte ids), yielding each with the time of the
  // run that produced its logits. Stop early by leaving the loop (`break`).
  async *generate(prompt, count, sampler) {
    const { ort, session } = this;
    const ids = (tokens) =>
      new ort.Tensor("int64", BigInt64Array.from(tokens, BigInt), [1, tokens.length]);
    const { n, fixed } = this.info;
    // The state starts empty (growing) or as n rows of zeros that the runs fill (static).
    let state = {};
    for (const s of this.info.state) {
      const rows = fixed ? n : 0;
      state[s.past] = new ort.Tensor("float32", new Float32Array(rows * s.width), [1, rows, s.width]);
    }
    let fed = prompt;
    let position = 0;
    for (let made = 0; made < count; ) {
      const feeds = { input_ids: ids(fed), ...state };
      if (fixed) feeds.position = new ort.Tensor("int64", BigInt64Array.of(BigInt(position)), [1]);
      const t0 = performance.now();
      const out = await session.run(feeds);
      const ms = performance.now() - t0;
      const logits = out.logits;
      if (logits.type !== "float32") throw new Error(`logits are ${logits.type}; the page reads float32`);
      const vocab = logits.dims[2];
      const last = logits.data.subarray((fed.length - 1) * vocab, fed.length * vocab);
      const next = sampler.pick(last);
      made += 1;
      yield { token: next, ms };
      state = {};
      for (const s of this.info.state) state[s.past] = out[s.present];
      position += fed.length;
      fed = [next];
    }
  }
}
