//! Messages that name settings: the library says each [`Setting`] in its own words (the
//! option a program sets), a front end in its own (the command line: the flag, in its one
//! table `cli::setting_flag`), so that no library message names a flag.

use std::fmt;

/// A setting a user can change, as messages name it. Each variant's doc names the library
/// option it is; [`Setting::describe`] gives its words in library messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Setting {
    /// `GmlpConfig::causal`.
    Causal,
    /// A carried state, in the form the target prefers (`Target::with_past_for`; in the
    /// library, the `SequenceMode` chosen).
    WithPast,
    /// The static state (`SequenceMode::Static`).
    StaticState,
    /// The growing state (`SequenceMode::Growing`).
    GrowingState,
    /// The build profile (`Target`).
    Target,
    /// The weights' element type (`Precision`).
    Dtype,
    /// How the spatial weight W is stored (`SpatialForm`).
    Spatial,
    /// Reading a checkpoint with tensors the model does not use (`allow_unused`).
    AllowUnused,
    /// Which implementation wrote a checkpoint (`WeightsFormat`).
    WeightsFormat,
    /// The sequence length of a token model (`GmlpConfig::seq_len`).
    SeqLen,
    /// A vision model's input channels (g-mlp-pytorch's `channels`).
    InChans,
    /// A vision model's patch size (g-mlp-pytorch's `patch_size`).
    PatchSize,
    /// The value of a symbolic input dimension (`ValidateOptions::dims`).
    Dim,
    /// validate's decode phases of a model with a carried state
    /// (`ValidateOptions::decode_prefill`, `decode_steps`, `decode_chunk`).
    DecodePhases,
    /// The folder pictures are written to (`write_pictures`).
    Plot,
    /// Triton's model version (`TritonOptions::version`).
    TritonVersion,
    /// Triton's model name (`TritonOptions::name`).
    TritonName,
    /// Triton's `max_sequence_idle_microseconds` (`TritonOptions::max_sequence_idle_us`).
    TritonMaxSequenceIdleUs,
    /// Triton's instance count (`TritonOptions::instance_count`).
    TritonInstances,
    /// Triton's TensorRT accelerator (`TritonOptions::tensorrt`).
    TritonTensorrt,
    /// Triton's instance kind (`TritonOptions::kind`).
    TritonKind,
    /// Triton's `max_batch_size` (`TritonOptions::max_batch_size`).
    TritonMaxBatchSize,
    /// The Triton servers a router spreads sequences over (`RouterOptions::servers`).
    RouterServers,
    /// Where the router's configuration is written (`RouterOptions::config`).
    RouterConfig,
    /// The port the router listens on (`RouterOptions::port`).
    RouterPort,
    /// The address the router listens on (`RouterOptions::address`).
    RouterAddress,
    /// The Triton endpoint (or router) a remote generation talks to (`RemoteOptions::url`).
    Server,
    /// How many times a remote sequence may start again (`RemoteOptions::max_restarts`).
    MaxRestarts,
}

impl Setting {
    /// Every setting, in declaration order.
    pub const ALL: [Setting; 28] = [
        Setting::Causal,
        Setting::WithPast,
        Setting::StaticState,
        Setting::GrowingState,
        Setting::Target,
        Setting::Dtype,
        Setting::Spatial,
        Setting::AllowUnused,
        Setting::WeightsFormat,
        Setting::SeqLen,
        Setting::InChans,
        Setting::PatchSize,
        Setting::Dim,
        Setting::DecodePhases,
        Setting::Plot,
        Setting::TritonVersion,
        Setting::TritonName,
        Setting::TritonMaxSequenceIdleUs,
        Setting::TritonInstances,
        Setting::TritonTensorrt,
        Setting::TritonKind,
        Setting::TritonMaxBatchSize,
        Setting::RouterServers,
        Setting::RouterConfig,
        Setting::RouterPort,
        Setting::RouterAddress,
        Setting::Server,
        Setting::MaxRestarts,
    ];

    /// The setting in library messages: the name of the option a program sets, qualified
    /// by its type where the bare name would be ambiguous.
    pub fn describe(self) -> &'static str {
        match self {
            Setting::Causal => "causal",
            Setting::WithPast => "with_past",
            Setting::StaticState => "SequenceMode::Static",
            Setting::GrowingState => "SequenceMode::Growing",
            Setting::Target => "target",
            Setting::Dtype => "dtype",
            Setting::Spatial => "spatial",
            Setting::AllowUnused => "allow_unused",
            Setting::WeightsFormat => "ImportHints::format",
            Setting::SeqLen => "seq_len",
            Setting::InChans => "in_chans",
            Setting::PatchSize => "patch_size",
            Setting::Dim => "dims",
            Setting::DecodePhases => "decode_prefill/decode_steps/decode_chunk",
            Setting::Plot => "the picture folder",
            Setting::TritonVersion => "TritonOptions::version",
            Setting::TritonName => "TritonOptions::name",
            Setting::TritonMaxSequenceIdleUs => "TritonOptions::max_sequence_idle_us",
            Setting::TritonInstances => "TritonOptions::instance_count",
            Setting::TritonTensorrt => "TritonOptions::tensorrt",
            Setting::TritonKind => "TritonOptions::kind",
            Setting::TritonMaxBatchSize => "TritonOptions::max_batch_size",
            Setting::RouterServers => "RouterOptions::servers",
            Setting::RouterConfig => "RouterOptions::config",
            Setting::RouterPort => "RouterOptions::port",
            Setting::RouterAddress => "RouterOptions::address",
            Setting::Server => "RemoteOptions::url",
            Setting::MaxRestarts => "RemoteOptions::max_restarts",
        }
    }
}

/// One part of a [`Phrase`].
#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(String),
    Setting(Setting),
}

/// A one-line message whose settings are kept as [`Setting`]s: `Display` says them with
/// [`Setting::describe`], [`Phrase::render`] with a front end's names.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Phrase(Vec<Part>);

impl Phrase {
    /// A message starting with `text`.
    pub fn text(text: impl Into<String>) -> Phrase {
        Phrase::default().then(text)
    }

    /// A message starting with `setting`.
    pub fn setting(setting: Setting) -> Phrase {
        Phrase::default().and(setting)
    }

    /// `text` appended.
    pub fn then(mut self, text: impl Into<String>) -> Phrase {
        self.0.push(Part::Text(text.into()));
        self
    }

    /// `setting` appended.
    pub fn and(mut self, setting: Setting) -> Phrase {
        self.0.push(Part::Setting(setting));
        self
    }

    /// `other` appended.
    pub fn append(mut self, other: Phrase) -> Phrase {
        self.0.extend(other.0);
        self
    }

    /// The settings the message names, in order.
    pub fn settings(&self) -> impl Iterator<Item = Setting> + '_ {
        self.0.iter().filter_map(|p| match p {
            Part::Setting(s) => Some(*s),
            Part::Text(_) => None,
        })
    }

    /// The message with each setting named by `name`.
    pub fn render(&self, name: impl Fn(Setting) -> &'static str) -> String {
        self.0
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.as_str(),
                Part::Setting(s) => name(*s),
            })
            .collect()
    }
}

impl fmt::Display for Phrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(Setting::describe))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_says_its_settings_in_the_words_asked_for() {
        let m = Phrase::setting(Setting::TritonVersion)
            .then(" must be >= 1; or set ")
            .and(Setting::TritonName);
        assert_eq!(
            m.to_string(),
            "TritonOptions::version must be >= 1; or set TritonOptions::name"
        );
        let flag = |s| match s {
            Setting::TritonVersion => "--triton-version",
            _ => "--other",
        };
        assert_eq!(
            m.render(flag),
            "--triton-version must be >= 1; or set --other"
        );
        assert_eq!(
            m.settings().collect::<Vec<_>>(),
            [Setting::TritonVersion, Setting::TritonName]
        );
    }
}
