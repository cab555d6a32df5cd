//! A tokenizer for byte-level models (vocabulary 256: token b is byte b, what `generate
//! --prompt-text` assumes), in the Hugging Face `tokenizer.json` form that `og.Tokenizer`
//! (onnxruntime-extensions) reads: GPT-2's byte-level BPE with the 256 byte symbols as its
//! whole vocabulary and no merges, so every byte of a text is one token and the decoder
//! turns tokens back into the same bytes. The end token added by the folder (id 256, when
//! the model has none) is a special token, skipped when decoding.

use serde_json::{json, Map, Value};

/// Text of the added end token.
pub const END_TEXT: &str = "<|endoftext|>";

/// GPT-2's printable stand-in for each byte (`bytes_to_unicode` of its encoder.py): the
/// printable Latin-1 characters stand for themselves, the other bytes for 256 + k.
pub fn byte_symbol(byte: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(byte) {
        return char::from(byte);
    }
    let k = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(256 + k).unwrap_or('?')
}

/// `tokenizer.json`: the byte vocabulary, plus `end_token` as an added special token when
/// it lies outside the bytes.
pub fn tokenizer_json(end_token: i64) -> String {
    let vocab: Map<String, Value> = (0..=255u8)
        .map(|b| (byte_symbol(b).to_string(), json!(b)))
        .collect();
    let added: Vec<Value> = if end_token >= 256 {
        vec![json!({
            "id": end_token, "content": END_TEXT, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        })]
    } else {
        Vec::new()
    };
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false
    });
    let t = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": []
        }
    });
    let mut text = serde_json::to_string_pretty(&t).unwrap_or_default();
    text.push('\n');
    text
}

/// `tokenizer_config.json`: GPT-2's tokenizer class, its end token and the context length.
pub fn tokenizer_config_json(end_token: i64, n: usize) -> String {
    let end = if end_token >= 256 {
        END_TEXT.to_string()
    } else {
        byte_symbol(end_token as u8).to_string()
    };
    let t = json!({
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": false,
        "add_prefix_space": false,
        "bos_token": end,
        "eos_token": end,
        "pad_token": end,
        "unk_token": end,
        "model_max_length": n,
        "clean_up_tokenization_spaces": false
    });
    let mut text = serde_json::to_string_pretty(&t).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_has_its_own_symbol_as_gpt2_assigns_them() {
        let symbols: std::collections::BTreeSet<char> = (0..=255u8).map(byte_symbol).collect();
        assert_eq!(symbols.len(), 256);
        // GPT-2's table: space is Ġ (U+0120), newline Ċ (U+010A), 'a' itself.
        assert_eq!(byte_symbol(b' '), '\u{120}');
        assert_eq!(byte_symbol(b'\n'), '\u{10A}');
        assert_eq!(byte_symbol(b'a'), 'a');
        assert_eq!(byte_symbol(0), '\u{100}');
    }

    #[test]
    fn the_end_token_is_added_only_outside_the_bytes() {
        let with: Value = serde_json::from_str(&tokenizer_json(256)).unwrap();
        assert_eq!(with["added_tokens"][0]["id"], 256);
        assert_eq!(with["model"]["vocab"].as_object().unwrap().len(), 256);
        let without: Value = serde_json::from_str(&tokenizer_json(10)).unwrap();
        assert!(without["added_tokens"].as_array().unwrap().is_empty());
    }
}
