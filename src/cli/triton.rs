//! `gmlp-onnx triton`: put an ONNX file into a Triton Inference Server model repository,
//! and with `--servers` also write the sticky router's haproxy configuration for several
//! servers serving it; the `--triton-*` flags it shares with `build --triton-repo`.

use std::path::{Path, PathBuf};

use clap::Args;
use gmlp_onnx::serve::triton::router::{RouterOptions, ServerAddress};
use gmlp_onnx::serve::triton::{
    check_target, write_repository, InstanceKind, RepositoryWritten, TensorRtPrecision,
    TritonOptions,
};

#[derive(Args)]
pub struct TritonArgs {
    /// The ONNX model.
    pub model: PathBuf,
    /// The model repository (created if missing): writes REPO/NAME/config.pbtxt and REPO/NAME/VERSION/model.onnx.
    #[arg(long)]
    pub repo: PathBuf,
    /// The --triton-* options.
    #[command(flatten)]
    pub flags: TritonFlags,
    /// The router's options.
    #[command(flatten)]
    pub router: RouterFlags,
}

/// Several servers behind a sticky router (`triton --servers`).
#[derive(Args)]
pub struct RouterFlags {
    /// Triton servers (comma-separated HOST:PORT of their HTTP endpoints), each serving this same repository: also writes a haproxy configuration (--router-config) that sends every request of a sequence to one of them.
    #[arg(long, value_name = "HOST:PORT,...", requires = "router_config")]
    servers: Option<String>,
    /// Where to write the router's haproxy configuration (run it with `haproxy -f FILE`).
    #[arg(long, value_name = "FILE", requires = "servers")]
    router_config: Option<PathBuf>,
    /// The port the router listens on [default: 8080].
    #[arg(long, requires = "servers")]
    router_port: Option<u16>,
    /// The address the router listens on [default: 127.0.0.1; 0.0.0.0 for clients on other hosts].
    #[arg(long, value_name = "IP", requires = "servers")]
    router_address: Option<String>,
}

impl RouterFlags {
    /// The router's options for model `model`, checked; `None` without --servers.
    fn options(&self, model: &str) -> anyhow::Result<Option<(RouterOptions, &PathBuf)>> {
        let (Some(list), Some(path)) = (&self.servers, &self.router_config) else {
            return Ok(None);
        };
        let mut o = RouterOptions::new(model, ServerAddress::parse_list(list)?);
        o.port = self.router_port.unwrap_or(o.port);
        o.address = self.router_address.clone().unwrap_or(o.address);
        o.check()?;
        Ok(Some((o, path)))
    }
}

/// The `--triton-*` flags shared by `build --triton-repo` and `triton`.
#[derive(Args)]
pub struct TritonFlags {
    /// Triton model name [default: the preset name, else the model file's stem].
    #[arg(long)]
    triton_name: Option<String>,
    /// Version directory [default: 1].
    #[arg(long)]
    triton_version: Option<u64>,
    /// max_batch_size; 0 turns batching off [default: 8, 1 for growing-state with-past models].
    #[arg(long)]
    triton_max_batch_size: Option<u32>,
    /// Where the instances run [default: cpu].
    #[arg(long, value_enum)]
    triton_kind: Option<InstanceKind>,
    /// Model instances (instance_group count) [default: 1].
    #[arg(long)]
    triton_instances: Option<u32>,
    /// TensorRT execution accelerator for gpu instances.
    #[arg(long, value_enum)]
    triton_tensorrt: Option<TensorRtPrecision>,
    /// Dynamic batcher max_queue_delay_microseconds, also the sequence batcher's for static-state models [default: 100].
    #[arg(long)]
    triton_max_queue_delay_us: Option<u64>,
    /// max_sequence_idle_microseconds of a with-past model: a sequence without a request for this long loses its slot and state [default: 60000000].
    #[arg(long)]
    triton_max_sequence_idle_us: Option<u64>,
}

impl TritonFlags {
    /// The first --triton-* flag given, if any.
    pub fn any_given(&self) -> Option<&'static str> {
        [
            ("--triton-name", self.triton_name.is_some()),
            ("--triton-version", self.triton_version.is_some()),
            (
                "--triton-max-batch-size",
                self.triton_max_batch_size.is_some(),
            ),
            ("--triton-kind", self.triton_kind.is_some()),
            ("--triton-instances", self.triton_instances.is_some()),
            ("--triton-tensorrt", self.triton_tensorrt.is_some()),
            (
                "--triton-max-queue-delay-us",
                self.triton_max_queue_delay_us.is_some(),
            ),
            (
                "--triton-max-sequence-idle-us",
                self.triton_max_sequence_idle_us.is_some(),
            ),
        ]
        .into_iter()
        .find(|(_, given)| *given)
        .map(|(flag, _)| flag)
    }

    /// The repository options, with `default_name` when no --triton-name is given.
    pub fn options(&self, default_name: &str) -> TritonOptions {
        let mut o = TritonOptions::new(self.triton_name.as_deref().unwrap_or(default_name));
        o.version = self.triton_version.unwrap_or(o.version);
        o.max_batch_size = self.triton_max_batch_size;
        o.kind = self.triton_kind.unwrap_or(o.kind);
        o.instance_count = self.triton_instances.unwrap_or(o.instance_count);
        o.tensorrt = self.triton_tensorrt;
        o.max_queue_delay_us = self
            .triton_max_queue_delay_us
            .unwrap_or(o.max_queue_delay_us);
        o.max_sequence_idle_us = self.triton_max_sequence_idle_us;
        o
    }
}

/// A path's file name without its extension.
pub fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Prints what was written.
pub fn print_repository(w: &RepositoryWritten) {
    println!(
        "wrote Triton model {} (max_batch_size {}{}): {} and {}{}",
        w.config.options.name,
        w.config.max_batch_size,
        if w.config.states.is_empty() {
            String::new()
        } else if w.config.growing() {
            format!(", {} implicit states", w.config.states.len())
        } else if w.config.counts_positions() {
            format!(
                ", {} implicit states of fixed size and the position, sequences batched, clients send input_ids only",
                w.config.states.len() - 1
            )
        } else {
            format!(
                ", {} implicit states of fixed size, sequences batched",
                w.config.states.len()
            )
        },
        w.paths.config.display(),
        w.paths.model.display(),
        w.data_file
            .as_ref()
            .map(|d| format!(" + {}", d.display()))
            .unwrap_or_default()
    );
}

/// Runs `triton`: the router's configuration is checked and written aside first, and put
/// in place only once the repository is, so a refusal of either writes nothing.
pub fn run(a: TritonArgs) -> anyhow::Result<()> {
    let options = a.flags.options(&file_stem(&a.model));
    let router = a.router.options(&options.name)?;
    let pending = match &router {
        Some((o, path)) => {
            check_target(&a.repo, &options)?;
            Some(o.write_pending(path)?)
        }
        None => None,
    };
    let written = write_repository(&a.model, &a.repo, &options)?;
    print_repository(&written);
    if let (Some(pending), Some((o, path))) = (pending, &router) {
        pending.persist()?;
        println!(
            "wrote router configuration {} for {} servers, listening on {}:{}: haproxy -f {}",
            path.display(),
            o.servers.len(),
            o.address,
            o.port,
            path.display()
        );
    }
    Ok(())
}
