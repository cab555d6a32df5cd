//! Causal models as generators (docs/generation.md): `--with-past` on a model that cannot carry
//! state, prompts longer than n, generation past n, token ids outside the vocabulary, and
//! models that cannot decode given to `generate`: one line, exit 2, nothing written.

use std::path::{Path, PathBuf};

use super::{assert_refused, run_limited, s, HANG_LIMIT};
use crate::common::{Amlp, Build};

/// A causal aMLP with n = 8 and a vocabulary of 20, built by the CLI with `flags`.
fn small(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let build = Build::amlp(1, Amlp::Tiny)
        .args(&["--causal", "-q"])
        .args(flags);
    let o = run_limited(&build.argv(&out), HANG_LIMIT);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

#[test]
fn with_past_is_refused_where_state_cannot_be_carried() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("x.onnx");
    for (build, needle) in [
        (
            Build::preset("amlp-base").args(&["--layers", "1", "--with-past"]),
            "--with-past needs a causal model (--causal)",
        ),
        (
            Build::preset("gmlp-ti16").args(&["--layers", "1", "--causal", "--with-past"]),
            "--with-past applies to causal token models, and this is a vision model",
        ),
        (
            Build::preset("amlp-base").args(&[
                "--layers",
                "1",
                "--causal",
                "--with-past",
                "--fixed-seq",
            ]),
            "cannot be used with",
        ),
    ] {
        assert_refused(d, &build.argv(&out), 2, needle);
    }
}

#[test]
fn generation_refuses_long_prompts_passing_n_bad_ids_and_models_without_state() {
    let models = tempfile::tempdir().unwrap();
    let past = small(models.path(), "past.onnx", &["--with-past"]);
    let growing = small(models.path(), "growing.onnx", &["--with-past", "growing"]);
    let fixed = small(models.path(), "fixed.onnx", &["--fixed-seq"]);
    let variable = small(models.path(), "variable.onnx", &[]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Limits of n, in both state forms (the static one of a plain --with-past, the growing one).
    for p in [s(&past), s(&growing)] {
        for (args, needle) in [
            (
                &["generate", p, "--prompt-ids", "1,2,3,4,5,6,7,8,9"][..],
                "the prompt has 9 tokens, more than the model's 8 positions",
            ),
            (
                &[
                    "generate",
                    p,
                    "--prompt-ids",
                    "1,2,3",
                    "--max-new-tokens",
                    "6",
                ],
                "--max-new-tokens 6 would generate past the model's 8 positions",
            ),
            (
                &[
                    "validate",
                    p,
                    "--decode-prefill",
                    "6",
                    "--decode-steps",
                    "3",
                ],
                "must fit in the model's 8 positions",
            ),
        ] {
            assert_refused(d, args, 2, needle);
        }
    }
    let p = s(&past);
    for (args, needle) in [
        (
            &["generate", p, "--prompt-ids", "1,20"][..],
            "prompt token id 20 is outside the vocabulary 0..20",
        ),
        (
            &["generate", p, "--prompt-ids", "1,-3"],
            "outside the vocabulary",
        ),
        (
            &["generate", p, "--prompt-ids", "1,,2"],
            "'' is not a token id",
        ),
        (
            &["generate", p, "--prompt-text", "hello"],
            "--prompt-text needs a byte-level vocabulary of 256 tokens",
        ),
        (
            &["generate", p, "--prompt-ids", "1", "--temperature=-1"],
            "--temperature must be a finite number >= 0",
        ),
        (
            &["generate", s(&fixed), "--prompt-ids", "1"],
            "is not a causal token model built by gmlp-onnx with a variable length or a carried state; rebuild it with `build --causal --with-past`",
        ),
        (
            &["validate", s(&variable), "--decode-steps", "2"],
            "apply to models built with --with-past",
        ),
    ] {
        assert_refused(d, args, 2, needle);
    }
}
