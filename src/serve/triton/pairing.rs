//! Triton pairs implicit states by index, not by name: its core keeps the input states and
//! the output states of a sequence in two maps sorted by name and takes the output at the
//! i-th place for the input at the i-th place (`SequenceStates::OutputState`,
//! triton-inference-server/server#8586, core#506). A configuration whose input and output
//! state names sort in different orders would feed one state's output into another
//! state's input without any error. [`check_state_pairing`] refuses such a configuration;
//! the names this tool writes (`past_X` → `present_X`, `position` →
//! `triton_next_position`) sort alike, which the tests below pin on a real model.

use super::unservable;
use crate::error::Result;

/// Checks that sorting the states by input name and by output name gives the same order,
/// the condition under which Triton's index pairing pairs each input with its own output.
/// `pairs` are each state's (input name, output name).
pub fn check_state_pairing<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<()> {
    let mut by_input: Vec<(&str, &str)> = pairs.into_iter().collect();
    let mut by_output = by_input.clone();
    by_input.sort_by_key(|&(input, _)| input);
    by_output.sort_by_key(|&(_, output)| output);
    for (k, (i, o)) in by_input.iter().zip(&by_output).enumerate() {
        if i.0 != o.0 {
            return Err(unservable(format!(
                "state names that Triton would pair wrongly: the {}th state by input name is {} (output {}) but the {}th by output name is {} (input {}); Triton pairs them by their sorted order (server#8586)",
                k + 1,
                i.0,
                i.1,
                k + 1,
                o.1,
                o.0
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::serve::triton::model_config::plan;
    use crate::serve::triton::TritonOptions;

    /// The names of Triton's report (server#8586): the output names sort the other way.
    #[test]
    fn names_that_sort_differently_are_refused() {
        let states = [
            ("cache_last_channel", "cache_last_channel_next"),
            ("cache_last_channel_len", "cache_last_channel_len_next"),
        ];
        let e = check_state_pairing(states).unwrap_err();
        assert!(matches!(e, Error::Unservable(_)), "{e:?}");
        assert!(check_state_pairing(states[..1].iter().copied()).is_ok());
    }

    /// A static-state aMLP of 12 blocks (block numbers 0..11 sort as text: 0, 1, 10, 11,
    /// 2, ...) with token shift: sgu, key, value and shift states of every block and the
    /// position counter, as `plan` writes them for Triton, sort alike by input and output
    /// name. Fails if a state kind or the counter is ever named so that they do not.
    #[test]
    fn the_states_of_a_real_model_sort_alike_by_input_and_output_name() {
        use crate::gmlp::{
            export::export_for, init::SeededInit, presets::preset, targets::BuildTarget,
            SequenceMode, Task,
        };
        let mut cfg = preset("amlp-base").unwrap().config;
        cfg.task = Task::Tokens {
            vocab_size: 20,
            seq_len: 8,
            tied_embedding: false,
        };
        (cfg.layers, cfg.d_model, cfg.d_ffn, cfg.attn_dim) = (12, 8, 16, Some(4));
        (cfg.causal, cfg.shift_tokens) = (true, 1);
        let source = std::sync::Arc::new(SeededInit {
            seed: 1,
            scheme: crate::gmlp::init::InitScheme::Spread,
        });
        let built = export_for(
            &cfg,
            source,
            "pairing",
            None,
            &BuildTarget::at_opset(17),
            SequenceMode::Static,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("static.onnx");
        crate::onnx::writer::write_model(&built.graph, &built.info, &path, |_, _| {}).unwrap();
        let model = crate::onnx::reader::read_model(&path).unwrap();
        let config = plan(&model, &TritonOptions::new("lm")).unwrap();
        // 12 blocks × (sgu, key, value, shift) + the position.
        assert_eq!(config.states.len(), 12 * 4 + 1, "{:?}", config.states);
        let mut inputs: Vec<&str> = config
            .states
            .iter()
            .map(|s| s.input.name.as_str())
            .collect();
        inputs.sort();
        let mut outputs: Vec<&str> = config
            .states
            .iter()
            .map(|s| s.output_name.as_str())
            .collect();
        outputs.sort();
        for (i, o) in inputs.iter().zip(&outputs) {
            let paired = config.states.iter().find(|s| s.input.name == *i).unwrap();
            assert_eq!(paired.output_name, *o, "Triton would feed {o} into {i}");
        }
        let pairs = config.states.iter();
        check_state_pairing(pairs.map(|s| (s.input.name.as_str(), s.output_name.as_str())))
            .unwrap();
    }
}
