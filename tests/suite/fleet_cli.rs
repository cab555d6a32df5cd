//! The command line of several servers, without any server: `triton --servers` writes the
//! router's configuration beside the repository, or on bad input nothing at all;
//! `generate --server` refuses a malformed or unreachable endpoint in one line. The
//! servers themselves: tests/external/triton/fleet.rs.

use crate::common::{assert_refused, gmlp, output_text, path_str, small_token_model, tree};

#[test]
fn a_refused_triton_call_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = small_token_model(dir.path());
    let before = tree(dir.path());
    let repo = dir.path().join("repo");
    let config = dir.path().join("router.cfg");
    let (repo, config, model) = (path_str(&repo), path_str(&config), path_str(&model));
    let base = ["triton", model, "--repo", repo];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    for (extra, expected) in [
        (
            &[
                "--servers",
                "127.0.0.1:8001,127.0.0.1",
                "--router-config",
                config,
            ][..],
            "\"127.0.0.1\" in --servers is not HOST:PORT",
        ),
        (
            &["--servers", "127.0.0.1:99999", "--router-config", config],
            "1 to 65535",
        ),
        (&["--servers", "127.0.0.1:8001"], "--router-config"),
        (&["--router-config", config], "--servers"),
        (
            &["--servers", "a:1,a:1", "--router-config", config],
            "--servers names a:1 twice",
        ),
        (
            &[
                "--servers",
                "a:1",
                "--router-config",
                config,
                "--router-address",
                "any",
            ],
            "--router-address",
        ),
        (
            &[
                "--servers",
                "a:1",
                "--router-config",
                config,
                "--router-port",
                "0",
            ],
            "--router-port must be from 1 to 65535",
        ),
        (
            &[
                "--servers",
                "a:1",
                "--router-config",
                &format!("{}/no/router.cfg", dir.path().display()),
            ],
            "does not exist",
        ),
        (
            &["--servers", "a:1", "--router-config", path_str(dir.path())],
            "is a folder",
        ),
        (
            &[
                "--servers",
                "a:1",
                "--router-config",
                config,
                "--triton-version",
                "0",
            ],
            "--triton-version must be >= 1",
        ),
    ] {
        let args = with(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_refused(&args, expected);
        assert_eq!(tree(dir.path()), before, "{args:?} wrote something");
    }
}

#[test]
fn triton_with_servers_writes_the_repository_and_the_router() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = small_token_model(dir.path());
    let repo = dir.path().join("repo");
    let config = dir.path().join("router.cfg");
    let o = gmlp(&[
        "triton",
        path_str(&model),
        "--repo",
        path_str(&repo),
        "--triton-name",
        "lm",
        "--servers",
        "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000",
        "--router-config",
        path_str(&config),
        "--router-port",
        "9000",
    ]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(repo.join("lm/config.pbtxt").is_file());
    let text = std::fs::read_to_string(&config).expect("router config");
    for line in [
        "bind 127.0.0.1:9000",
        "balance hdr(X-Sequence-Id)",
        "http-check send meth GET uri /v2/models/lm/ready",
        "server 10.0.0.3:8000 10.0.0.3:8000",
    ] {
        assert!(text.contains(line), "{line}:\n{text}");
    }
}

#[test]
fn generate_refuses_a_bad_or_unreachable_server_in_one_line() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("port").port()
    };
    let url = format!("http://127.0.0.1:{dead}");
    assert_refused(
        &["generate", "--server", &url, "--prompt-ids", "1"],
        &format!("--server {url}: no answer from Triton"),
    );
    assert_refused(
        &["generate", "--server", "https://h:1", "--prompt-ids", "1"],
        "only http://",
    );
    assert_refused(
        &["generate", "--server", "h", "--prompt-ids", "1"],
        "--server h: not HOST:PORT",
    );
    assert_refused(
        &["generate", "m.onnx", "--server", &url, "--prompt-ids", "1"],
        "--server",
    );
    assert_refused(
        &["generate", "--triton-name", "lm", "--prompt-ids", "1"],
        "--server",
    );
}
