use super::*;
use crate::provider::{EXIT_CODE_PREFIX, exit_code};

fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|w| (*w).to_owned()).collect()
}

#[test]
fn wrapped_args_split_back_into_the_script_and_the_exact_words() {
    let original = words(&["python", "train.py", "--name", "it's a \"test\" $HOME"]);
    let args = wrapped_args(&original, Completion::RunOnce, None, None, false, None)
        .unwrap()
        .unwrap();
    let split = shlex::split(&args).unwrap();
    assert_eq!(split[0..2], ["sh", "-c"]);
    assert!(split[2].contains(EXIT_CODE_PREFIX));
    assert!(split[2].contains("runpodctl stop pod"));
    assert!(split[2].starts_with(&format!("marker={EXIT_MARKER}\n")));
    assert_eq!(split[3], SCRIPT_NAME);
    assert_eq!(split[4..], original[..]);
}

#[test]
fn the_script_reports_the_exit_code_and_stops_itself() {
    // Runs the real script with a fake runpodctl on PATH: the command's code is printed
    // last and the pod-scoped stop is called with the pod's own id.
    let dir = tempfile::tempdir().unwrap();
    let stub = dir.path().join("runpodctl");
    let called = dir.path().join("called");
    std::fs::write(
        &stub,
        format!("#!/bin/sh\necho \"$@\" > {}\n", called.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    let argv = wrapper_in(
        dir.path(),
        &["sh", "-c", "echo hi; exit 3"],
        Completion::RunOnce,
        None,
    );
    let output = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env("PATH", format!("{}:/usr/bin:/bin", dir.path().display()))
        .env("RUNPOD_POD_ID", "pod123")
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout, "hi\nrunpod-kubelet: exit-code=3\n");
    assert_eq!(output.status.code(), Some(3));
    assert_eq!(
        std::fs::read_to_string(called).unwrap(),
        "stop pod pod123\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("exit-code")).unwrap(),
        "3\n"
    );
}

#[test]
fn until_success_runs_again_after_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran-once");
    let command = format!(
        "if [ -e {m} ]; then exit 0; else touch {m}; exit 4; fi",
        m = marker.display()
    );
    let args = wrapped_args_at(
        &words(&["sh", "-c", &command]),
        Completion::UntilSuccess,
        None,
        &dir.path().join("exit-code").display().to_string(),
    )
    .unwrap()
    .unwrap()
    .replace("sleep 10", "sleep 0");
    let argv = shlex::split(&args).unwrap();
    let output = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env_remove("RUNPOD_POD_ID")
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        stdout,
        "runpod-kubelet: exit-code=4\nrunpod-kubelet: exit-code=0\n"
    );
}

/// The wrapper's argv for `list`, its exit marker at `dir/exit-code`.
fn wrapper_in(
    dir: &std::path::Path,
    list: &[&str],
    completion: Completion,
    setup: Option<&Setup>,
) -> Vec<String> {
    let marker = dir.join("exit-code").display().to_string();
    let args = wrapped_args_at(&words(list), completion, setup, &marker)
        .unwrap()
        .unwrap();
    shlex::split(&args).unwrap()
}

/// The shells the script is run under: `sh` (dash here), and busybox's ash and bash where
/// installed, as images' `/bin/sh` is one of these.
fn shells() -> Vec<Vec<&'static str>> {
    let installed = |name: &str| {
        ["/usr/bin", "/bin"]
            .iter()
            .any(|dir| std::path::Path::new(dir).join(name).exists())
    };
    let mut shells = vec![vec!["sh"]];
    if installed("busybox") {
        shells.push(vec!["busybox", "sh"]);
    }
    if installed("bash") {
        shells.push(vec!["bash", "--posix"]);
    }
    shells
}

/// `argv` (a wrapper, `sh` first) run under `shell` instead.
fn under(shell: &[&str], argv: &[String]) -> std::process::Command {
    let mut command = std::process::Command::new(shell[0]);
    command.args(&shell[1..]).args(&argv[1..]);
    command
}

/// Starts the wrapper, waits until its command has created `ready`, sends the wrapper
/// `signal` (as RunPod's stop sends TERM to PID 1), and returns what it printed.
fn signal_the_wrapper(
    shell: &[&str],
    argv: &[String],
    ready: &std::path::Path,
    signal: &str,
) -> std::process::Output {
    use std::process::Stdio;
    let mut command = under(shell, argv);
    if signal == "INT" {
        // A container's PID 1 starts with default signal dispositions; a test run from a
        // background job inherits INT ignored, which a shell then cannot trap (POSIX).
        // perl resets it and execs the wrapper in its place (same PID).
        let mut reset = std::process::Command::new("perl");
        reset
            .args([
                "-e",
                r#"$SIG{INT} = "DEFAULT"; exec @ARGV or die "exec: $!""#,
                "--",
            ])
            .arg(command.get_program())
            .args(command.get_args());
        command = reset;
    }
    let wrapper = command
        .env_remove("RUNPOD_POD_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ready.exists() {
        assert!(std::time::Instant::now() < deadline, "{shell:?}: no start");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let sent = std::process::Command::new("sh")
        .args(["-c", r#"kill -s "$1" "$2""#, "sh", signal])
        .arg(wrapper.id().to_string())
        .status()
        .unwrap();
    assert!(sent.success());
    wrapper.wait_with_output().unwrap()
}

#[test]
fn term_reaches_the_command_and_its_code_is_reported() {
    // A plain `sh` command that traps TERM; without the wrapper passing it on, the command
    // would sleep on and end with "not signalled" and code 1.
    let command = r#"trap 'kill "$s"; echo TERM >"$0"; exit 7' TERM
        sleep 20 & s=$!; : >"$1"; wait "$s"; echo not signalled; exit 1"#;
    for shell in shells() {
        let dir = tempfile::tempdir().unwrap();
        let (got, ready) = (dir.path().join("got"), dir.path().join("ready"));
        let (got_arg, ready_arg) = (got.display().to_string(), ready.display().to_string());
        let argv = wrapper_in(
            dir.path(),
            &["sh", "-c", command, &got_arg, &ready_arg],
            Completion::RunOnce,
            None,
        );
        let output = signal_the_wrapper(&shell, &argv, &ready, "TERM");
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert_eq!(stdout, "runpod-kubelet: exit-code=7\n", "{shell:?}");
        assert_eq!(output.status.code(), Some(7), "{shell:?}");
        assert_eq!(std::fs::read_to_string(&got).unwrap(), "TERM\n");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("exit-code")).unwrap(),
            "7\n"
        );
    }
}

#[test]
fn int_reaches_a_command_with_its_own_handler() {
    // A background command starts with INT ignored (POSIX), which a shell's `trap` cannot
    // undo; a program that installs its own handler (perl here) gets the INT passed on.
    let command = r#"$SIG{INT} = sub { open my $f, '>', $ARGV[0] or die; print $f "INT\n";
        close $f; exit 7 }; open my $r, '>', $ARGV[1] or die; close $r; sleep 20;
        print "not signalled\n"; exit 1"#;
    for shell in shells() {
        let dir = tempfile::tempdir().unwrap();
        let (got, ready) = (dir.path().join("got"), dir.path().join("ready"));
        let (got_arg, ready_arg) = (got.display().to_string(), ready.display().to_string());
        let argv = wrapper_in(
            dir.path(),
            &["perl", "-e", command, &got_arg, &ready_arg],
            Completion::RunOnce,
            None,
        );
        let output = signal_the_wrapper(&shell, &argv, &ready, "INT");
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert_eq!(stdout, "runpod-kubelet: exit-code=7\n", "{shell:?}");
        assert_eq!(output.status.code(), Some(7), "{shell:?}");
        assert_eq!(std::fs::read_to_string(&got).unwrap(), "INT\n");
    }
}

#[test]
fn a_signal_ends_on_failure_retries_at_once() {
    // The command fails; TERM comes during the attempt or the 10 s pause after it. Either
    // way there is no second attempt, and the last line carries the code the wrapper ends with.
    let command = r#"echo try >>"$0"; : >"$1"; exit 4"#;
    for shell in shells() {
        let dir = tempfile::tempdir().unwrap();
        let (tries, ready) = (dir.path().join("tries"), dir.path().join("ready"));
        let (tries_arg, ready_arg) = (tries.display().to_string(), ready.display().to_string());
        let argv = wrapper_in(
            dir.path(),
            &["sh", "-c", command, &tries_arg, &ready_arg],
            Completion::UntilSuccess,
            None,
        );
        let started = std::time::Instant::now();
        let output = signal_the_wrapper(&shell, &argv, &ready, "TERM");
        // The pause between attempts is 10 s: ending sooner means the signal cut it short
        // (no tighter bound: a loaded machine is slow to start the wrapper).
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{shell:?}"
        );
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert_eq!(exit_code(stdout.lines()), output.status.code(), "{stdout}");
        assert!(matches!(output.status.code(), Some(4 | 143)), "{stdout}");
        assert_eq!(
            std::fs::read_to_string(&tries).unwrap(),
            "try\n",
            "{shell:?}"
        );
    }
}

#[test]
fn a_restarted_wrapper_reports_the_recorded_code_without_running_the_command_again() {
    // No runpodctl, so the self-stop fails and RunPod would restart the container: the
    // second run, with the first one's marker, must not run the command again.
    for dir in ["/usr/bin", "/bin"] {
        assert!(!std::path::Path::new(dir).join("runpodctl").exists());
    }
    let command = r#"echo ran >>"$0"; exit "$1""#;
    for shell in shells() {
        for (completion, code) in [(Completion::RunOnce, "5"), (Completion::UntilSuccess, "0")] {
            let dir = tempfile::tempdir().unwrap();
            let counter = dir.path().join("counter");
            let counter_arg = counter.display().to_string();
            let argv = wrapper_in(
                dir.path(),
                &["sh", "-c", command, &counter_arg, code],
                completion,
                None,
            );
            for run in ["first", "restarted"] {
                let output = under(&shell, &argv)
                    .env("PATH", "/usr/bin:/bin")
                    .env("RUNPOD_POD_ID", "pod123")
                    .output()
                    .unwrap();
                let context = format!("{shell:?} {completion:?} {run}");
                let stdout = String::from_utf8(output.stdout).unwrap();
                assert_eq!(
                    stdout,
                    format!("runpod-kubelet: exit-code={code}\n"),
                    "{context}"
                );
                assert_eq!(output.status.code(), code.parse().ok(), "{context}");
                assert!(output.stderr.is_empty(), "{context}");
                assert_eq!(
                    std::fs::read_to_string(&counter).unwrap(),
                    "ran\n",
                    "{context}"
                );
                assert_eq!(
                    std::fs::read_to_string(dir.path().join("exit-code")).unwrap(),
                    format!("{code}\n"),
                    "{context}"
                );
            }
        }
    }
}

#[test]
fn a_marker_that_cannot_be_written_only_loses_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let argv = wrapper_in(
        &dir.path().join("missing"),
        &["sh", "-c", "exit 3"],
        Completion::RunOnce,
        None,
    );
    for shell in shells() {
        let output = under(&shell, &argv)
            .env_remove("RUNPOD_POD_ID")
            .output()
            .unwrap();
        assert_eq!(output.stdout, b"runpod-kubelet: exit-code=3\n", "{shell:?}");
        assert!(output.stderr.is_empty(), "{shell:?}");
        assert_eq!(output.status.code(), Some(3), "{shell:?}");
    }
}

/// A pod that runs forever with probes or a `preStop` hook starts the node's sshd (they run
/// over SSH), then runs its command and ends with its code (RunPod restarts it).
#[test]
fn a_forever_pod_with_a_shell_starts_sshd_and_ends_with_its_command() {
    let args = wrapped_args(
        &words(&["sh", "-c", "echo serving; exit 7"]),
        Completion::Forever,
        None,
        None,
        true,
        None,
    )
    .unwrap()
    .expect("wrapped");
    assert!(args.contains("runpod_kubelet_sshd"), "{args}");
    assert!(
        !args.contains("marker="),
        "no exit marker: it never ends by itself"
    );
    let argv = shlex::split(&args).unwrap();
    let output = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env_remove("PUBLIC_KEY")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "serving\n");
    assert_eq!(output.status.code(), Some(7));
}

#[test]
fn forever_and_commandless_pods_are_not_wrapped() {
    assert_eq!(
        wrapped_args(
            &words(&["serve"]),
            Completion::Forever,
            None,
            None,
            false,
            None
        ),
        Ok(None)
    );
    assert_eq!(
        wrapped_args(&[], Completion::RunOnce, None, None, false, None),
        Ok(None)
    );
}

#[test]
fn the_last_reported_code_wins_and_noise_is_ignored() {
    let log = [
        "starting",
        "runpod-kubelet: exit-code=4",
        "runpod-kubelet: exit-code=oops",
        "  runpod-kubelet: exit-code=0  ",
        "bye",
    ];
    assert_eq!(exit_code(log), Some(0));
    assert_eq!(exit_code(["runpod-kubelet: exit-code="]), None);
    assert_eq!(exit_code(["no code here"]), None);
}

fn run_script(
    args: &str,
    envs: &std::collections::BTreeMap<String, String>,
) -> std::process::Output {
    let argv = shlex::split(args).unwrap();
    std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .envs(envs)
        .env_remove("RUNPOD_POD_ID")
        .output()
        .unwrap()
}

#[test]
fn setup_writes_the_files_before_the_command_and_keeps_contents_out_of_args() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().display().to_string();
    let secret_path = format!("{root}/secrets/it's here/token");
    let config_path = format!("{root}/etc/app.yaml");
    let scratch = format!("{root}/scratch");
    let secret: &[u8] = &[0, 159, 146, 150, b'\n', b'\''];
    let files = [
        FileToWrite {
            path: &secret_path,
            content: secret,
            mode: 0o400,
        },
        FileToWrite {
            path: &config_path,
            content: b"lr: 0.1\n",
            mode: 0o644,
        },
    ];
    let setup = Setup::new(&files, std::slice::from_ref(&scratch))
        .unwrap()
        .unwrap();
    assert_eq!(setup.env.len(), 2);
    for completion in [Completion::RunOnce, Completion::Forever] {
        let command = format!(
            "cat {config_path:?}; ls -d {scratch:?}; env | grep -c {FILE_ENV_PREFIX} || true"
        );
        let marker = dir.path().join(format!("exit-code-{completion:?}"));
        let args = wrapped_args_at(
            &words(&["sh", "-c", &command]),
            completion,
            Some(&setup),
            &marker.display().to_string(),
        )
        .unwrap()
        .unwrap();
        assert!(!args.contains("lr: 0.1"), "contents travel in env only");
        let output = run_script(&args, &setup.env);
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert!(
            stdout.starts_with(&format!("lr: 0.1\n{scratch}\n0\n")),
            "{stdout}"
        );
        assert_eq!(std::fs::read(&secret_path).unwrap(), secret);
        let mode = std::fs::metadata(&secret_path)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
        std::fs::set_permissions(&secret_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}

#[test]
fn a_failed_setup_is_reported_as_exit_code_126_without_running_the_command() {
    let setup = Setup::new(
        &[FileToWrite {
            path: "/proc/runpod-kubelet-cannot-write-here/file",
            content: b"x",
            mode: 0o644,
        }],
        &[],
    )
    .unwrap()
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("exit-code").display().to_string();
    let args = wrapped_args_at(
        &words(&["echo", "ran"]),
        Completion::RunOnce,
        Some(&setup),
        &marker,
    )
    .unwrap()
    .unwrap();
    let output = run_script(&args, &setup.env);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout, "runpod-kubelet: exit-code=126\n");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("could not write the pod's volume files")
    );
}

#[test]
fn files_without_a_command_cannot_be_wrapped() {
    let setup = Setup::new(&[], &["/scratch".to_owned()]).unwrap().unwrap();
    let error =
        wrapped_args(&[], Completion::Forever, Some(&setup), None, false, None).unwrap_err();
    assert!(error.contains("set `command`"), "{error}");
    assert_eq!(Setup::new(&[], &[]), Ok(None));
}

#[test]
fn host_keys_are_read_from_the_wrappers_and_the_start_scripts_lines() {
    let log = [
        "starting",
        "runpod-kubelet: ssh-host-key=SHA256:wrapperKey+/1",
        "256 SHA256:startScriptKey root@abc (ED25519)",
        "3072 SHA256:startScriptKey root@abc (RSA)",
        "my program says SHA256:notAKey",
        "256 MD5:aa:bb root@abc (ED25519)",
        "runpod-kubelet: ssh-host-key=SHA256:bad key",
        "runpod-kubelet: exit-code=0",
    ];
    assert_eq!(
        host_key_fingerprints(log),
        ["SHA256:wrapperKey+/1", "SHA256:startScriptKey"]
    );
    assert!(is_host_key_line("runpod-kubelet: ssh-host-key=SHA256:x"));
    assert!(!is_host_key_line("runpod-kubelet: exit-code=0"));
}

#[test]
fn the_wrapper_starts_the_images_sshd_with_the_nodes_key() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let started = dir.path().join("sshd-started");
    for (name, body) in [
        ("sshd", format!("#!/bin/sh\ntouch {}\n", started.display())),
        ("ssh-keygen", "#!/bin/sh\nexit 0\n".to_owned()),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let run = |key: Option<&str>| {
        let argv = wrapper_in(dir.path(), &["echo", "ran"], Completion::RunOnce, None);
        let mut command = std::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .env("PATH", format!("{}:/usr/bin:/bin", dir.path().display()))
            .env("HOME", &home);
        if let Some(key) = key {
            command.env("PUBLIC_KEY", key);
        }
        let _ = std::fs::remove_file(dir.path().join("exit-code"));
        command.output().unwrap()
    };
    // No key: no sshd, and the command runs as before.
    let output = run(None);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "ran\nrunpod-kubelet: exit-code=0\n"
    );
    assert!(!started.exists());
    // With the key: authorized, sshd started, the command still runs and reports.
    let output = run(Some("ssh-ed25519 AAAAnode"));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "ran\nrunpod-kubelet: exit-code=0\n"
    );
    assert!(started.exists(), "sshd was not started");
}

/// Issue 41, item 4: the sshd the wrapper starts answers on a public port, so it is key-only
/// and knows only `$PUBLIC_KEY`, whatever the image's own `sshd_config` allows; and its host
/// keys' fingerprints are printed for the controller to read from the log.
#[test]
fn the_wrapper_starts_sshd_key_only_whatever_the_images_config_says() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let etc = root.join("etc/ssh");
    std::fs::create_dir_all(&etc).unwrap();
    // The image's own config: passwords and empty passwords welcome.
    std::fs::write(
        etc.join("sshd_config"),
        "PasswordAuthentication yes\nPermitEmptyPasswords yes\nAuthorizedKeysFile .ssh/baked_keys\n",
    )
    .unwrap();
    let args_file = dir.path().join("sshd-args");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, body) in [
        (
            "sshd",
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$@\" > {}\n",
                args_file.display()
            ),
        ),
        // Makes one host key pair (the path is the last argument); prints its fingerprint as
        // OpenSSH does.
        (
            "ssh-keygen",
            "#!/bin/sh\ncase \"$1\" in\n-q) for path; do :; done; touch \"$path\" \"$path.pub\" ;;\n\
             -E) echo \"256 SHA256:hostkeyfingerprint root@pod (ED25519)\" ;;\nesac\n"
                .to_owned(),
        ),
    ] {
        let path = bin.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let argv = wrapper_in(dir.path(), &["echo", "ran"], Completion::RunOnce, None);
    let output = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("HOME", dir.path().join("home"))
        .env("RUNPOD_KUBELET_SSH_ROOT", &root)
        .env("PUBLIC_KEY", "ssh-rsa AAAAmine\nssh-ed25519 AAAAnode")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "runpod-kubelet: ssh-host-key=SHA256:hostkeyfingerprint\nran\nrunpod-kubelet: exit-code=0\n"
    );
    let own = etc.join("runpod-kubelet");
    let args = std::fs::read_to_string(&args_file).unwrap();
    assert_eq!(
        args.lines().collect::<Vec<_>>(),
        ["-f", own.join("sshd_config").to_str().unwrap()],
        "sshd must read the wrapper's config, not the image's"
    );
    let config = std::fs::read_to_string(own.join("sshd_config")).unwrap();
    for line in [
        "PasswordAuthentication no",
        "ChallengeResponseAuthentication no",
        "PermitEmptyPasswords no",
        "PubkeyAuthentication yes",
        &format!(
            "AuthorizedKeysFile {}",
            own.join("authorized_keys").display()
        ),
        &format!("HostKey {}", own.join("ssh_host_ed25519_key").display()),
    ] {
        assert!(
            config.lines().any(|l| l == line),
            "{line:?} missing:\n{config}"
        );
    }
    assert!(!config.contains("yes\nPermitEmptyPasswords yes"));
    assert_eq!(
        std::fs::read_to_string(own.join("authorized_keys")).unwrap(),
        "ssh-rsa AAAAmine\nssh-ed25519 AAAAnode\n"
    );
    let mode = std::fs::metadata(own.join("authorized_keys"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "authorized keys readable by others");
    // Where OpenSSH's sshd is installed, it reads the config as key-only.
    if let Some(real) = ["/usr/sbin/sshd", "/usr/bin/sshd"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    {
        let key = etc.join("test_host_key");
        let _ = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .status();
        let effective = std::process::Command::new(real)
            .arg("-T")
            .arg("-f")
            .arg(own.join("sshd_config"))
            .arg("-h")
            .arg(&key)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&effective.stdout).to_lowercase();
        for line in [
            "passwordauthentication no",
            "kbdinteractiveauthentication no",
            "permitemptypasswords no",
        ] {
            assert!(text.contains(line), "sshd -T: {line:?} missing:\n{text}");
        }
    }
}

/// A command that is not there reads as the container runtime says it (not as the wrapper's
/// shell, with its name and line number), and ends with 127.
#[test]
fn a_missing_command_reads_as_the_runtime_says_it() {
    let dir = tempfile::tempdir().unwrap();
    let argv = wrapper_in(
        dir.path(),
        &["nonexistent-command", "--flag"],
        Completion::RunOnce,
        None,
    );
    let output = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.trim(),
        "exec: \"nonexistent-command\": executable file not found in $PATH"
    );
    assert!(!stderr.contains("runpod-kubelet-wrapper"), "{stderr}");
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "runpod-kubelet: exit-code=127\n"
    );
}

#[test]
fn the_wrappers_markers_are_kept_out_of_the_users_log() {
    assert!(is_marker_line("runpod-kubelet: exit-code=0"));
    assert!(is_marker_line("runpod-kubelet: ssh-host-key=SHA256:x"));
    assert!(!is_marker_line(
        "epoch 2: runpod-kubelet: exit-code=0 is what I print"
    ));
    assert!(!is_marker_line("hello"));
}

/// The wrapper's argv with a `postStart` hook, its exit marker in `dir`.
fn hooked_in(
    dir: &std::path::Path,
    list: &[&str],
    completion: Completion,
    hook: &[&str],
) -> Vec<String> {
    let marker = dir.join("exit-code").display().to_string();
    let args = wrapped_args_hooked(
        &words(list),
        completion,
        None,
        (Some(&words(hook)), false, None),
        &marker,
    )
    .unwrap()
    .unwrap();
    shlex::split(&args).unwrap()
}

/// postStart runs while the command runs (a command waiting for the hook's file sees it), on
/// every completion, and its output is not the container's.
#[test]
fn the_post_start_hook_runs_beside_the_command() {
    let waits = r#"for i in $(seq 1 100); do [ -f "$0" ] && echo saw-hook && exit 0; sleep 0.05; done; exit 1"#;
    for completion in [
        Completion::RunOnce,
        Completion::UntilSuccess,
        Completion::Forever,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("started").display().to_string();
        let argv = hooked_in(
            dir.path(),
            &["sh", "-c", waits, &flag],
            completion,
            &["sh", "-c", "echo hook-output; touch \"$0\"", &flag],
        );
        let output = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .unwrap();
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert!(stdout.starts_with("saw-hook\n"), "{completion:?}: {stdout}");
        assert!(!stdout.contains("hook-output"), "{completion:?}: {stdout}");
        assert_eq!(output.status.code(), Some(0), "{completion:?}: {stdout}");
        assert_eq!(post_start_failure(stdout.lines()), None);
    }
}

/// A failing postStart hook stops the command (TERM) and says so with its code, as the kubelet
/// kills a container whose hook failed.
#[test]
fn a_failing_post_start_hook_stops_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let argv = hooked_in(
        dir.path(),
        &["sleep", "30"],
        Completion::RunOnce,
        &["sh", "-c", "exit 3"],
    );
    let started = std::time::Instant::now();
    let output = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(post_start_failure(stdout.lines()), Some(3), "{stdout}");
    assert_eq!(
        exit_code(stdout.lines()),
        Some(143),
        "killed by TERM: {stdout}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the command was stopped, not waited for"
    );
    assert!(is_marker_line("runpod-kubelet: post-start-hook-failed=3"));
}

/// `post_start` is the script's own: one in the container's environment never runs.
#[test]
fn a_post_start_variable_in_the_environment_is_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let planted = dir.path().join("planted");
    let argv = wrapper_in(dir.path(), &["true"], Completion::RunOnce, None);
    let output = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env("post_start", format!("touch {}", planted.display()))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(!planted.exists(), "an inherited post_start ran");
}

/// The script with `inits` before `list`, run in `dir` with the init containers' env and
/// `env`: its stdout and exit code.
fn run_with_inits(
    dir: &std::path::Path,
    inits: &[(&str, serde_json::Value)],
    list: &[&str],
    completion: Completion,
    env: &[(&str, &str)],
) -> (String, Option<i32>) {
    let containers: Vec<(
        k8s_openapi::api::core::v1::Container,
        std::collections::BTreeMap<String, String>,
    )> = inits
        .iter()
        .map(|(name, spec)| {
            let mut spec = spec.clone();
            spec["name"] = serde_json::json!(name);
            let container: k8s_openapi::api::core::v1::Container =
                serde_json::from_value(spec).unwrap();
            let env = container
                .env
                .iter()
                .flatten()
                .map(|v| (v.name.clone(), v.value.clone().unwrap_or_default()))
                .collect();
            (container, env)
        })
        .collect();
    let pairs: Vec<_> = containers.iter().map(|(c, e)| (c, e.clone())).collect();
    let main_env: std::collections::BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let inits = Inits::of(&pairs, &main_env).unwrap().unwrap();
    let marker = dir.join("exit-code").display().to_string();
    let args = wrapped_args_hooked(
        &words(list),
        completion,
        None,
        (None, false, Some(&inits)),
        &marker,
    )
    .unwrap()
    .unwrap();
    let argv = shlex::split(&args).unwrap();
    let output = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .envs(inits.env.iter())
        .envs(env.iter().copied())
        .env("DIR", dir)
        .output()
        .unwrap();
    (
        String::from_utf8(output.stdout).unwrap(),
        output.status.code(),
    )
}

#[test]
fn init_containers_run_in_order_with_their_own_env_before_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, code) = run_with_inits(
        dir.path(),
        &[
            (
                "fetch",
                serde_json::json!({"command": ["sh", "-c", "echo \"$WHAT:${MAIN_ONLY:-unset}\" > \"$DIR/f\"; echo fetched"],
                                   "env": [{"name": "WHAT", "value": "it's data"}]}),
            ),
            (
                "check",
                serde_json::json!({"command": ["sh", "-c", "test -f \"$DIR/f\" && echo checked"]}),
            ),
        ],
        &[
            "sh",
            "-c",
            "cat \"$DIR/f\"; echo \"main:$MAIN_ONLY:${WHAT:-unset}\"",
        ],
        Completion::RunOnce,
        &[("MAIN_ONLY", "m")],
    );
    assert_eq!(
        stdout,
        "runpod-kubelet: container=fetch\nfetched\nrunpod-kubelet: init-exit-code=fetch=0\n\
         runpod-kubelet: container=check\nchecked\nrunpod-kubelet: init-exit-code=check=0\n\
         runpod-kubelet: initialized\nit's data:unset\nmain:m:unset\nrunpod-kubelet: exit-code=0\n"
    );
    assert_eq!(code, Some(0));
    // A container RunPod restarts does not run them again (only the exit marker would replay a
    // finished run; here the run is started afresh with the marker of the first removed).
    std::fs::remove_file(dir.path().join("exit-code")).unwrap();
    let (again, _) = run_with_inits(
        dir.path(),
        &[(
            "fetch",
            serde_json::json!({"command": ["sh", "-c", "echo fetched"]}),
        )],
        &["true"],
        Completion::RunOnce,
        &[],
    );
    assert!(!again.contains("fetched"), "{again}");
    assert!(again.contains("runpod-kubelet: initialized"), "{again}");
}

#[test]
fn a_failed_init_container_ends_a_run_once_pod_without_its_command() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, code) = run_with_inits(
        dir.path(),
        &[(
            "prep",
            serde_json::json!({"command": ["sh", "-c", "echo failing; exit 3"]}),
        )],
        &["sh", "-c", "echo main ran"],
        Completion::RunOnce,
        &[],
    );
    assert_eq!(
        stdout,
        "runpod-kubelet: container=prep\nfailing\nrunpod-kubelet: init-exit-code=prep=3\n\
         runpod-kubelet: exit-code=3\n"
    );
    assert_eq!(code, Some(3));
    for line in stdout.lines().filter(|l| l.starts_with("runpod-kubelet:")) {
        assert!(
            is_marker_line(line),
            "{line} is not kept out of kubectl logs"
        );
    }
}

#[test]
fn the_log_is_split_by_container_and_read_for_the_init_containers_progress() {
    let log = [
        "runpod-kubelet: ssh-host-key=SHA256:abc",
        "runpod-kubelet: container=fetch",
        "fetching",
        "runpod-kubelet: init-exit-code=fetch=2",
        "runpod-kubelet: container=fetch",
        "fetching again",
        "runpod-kubelet: init-exit-code=fetch=0",
        "runpod-kubelet: container=check",
        "checked",
        "runpod-kubelet: init-exit-code=check=0",
        "runpod-kubelet: initialized",
        "serving",
    ];
    let pick = |wanted: Option<&str>| -> Vec<&str> {
        let mut owner = LogOwner::new(true);
        log.iter()
            .copied()
            .filter(|l| owner.keeps(l, wanted))
            .collect()
    };
    assert_eq!(pick(Some("fetch")), ["fetching", "fetching again"]);
    assert_eq!(pick(Some("check")), ["checked"]);
    assert_eq!(pick(None), ["serving"]);
    let progress = init_progress(log.iter().copied());
    assert!(progress.initialized);
    assert_eq!(progress.runs.len(), 2);
    assert_eq!(
        (
            progress.runs[0].starts,
            progress.runs[0].last_code,
            progress.runs[0].running
        ),
        (2, Some(0), false)
    );
    // Half-way: fetch failed once and runs again; nothing after it started.
    let partial = init_progress(log[..5].iter().copied());
    assert!(!partial.initialized);
    assert_eq!(
        (
            partial.runs[0].starts,
            partial.runs[0].last_code,
            partial.runs[0].running
        ),
        (2, Some(2), true)
    );
    // A pod without init containers: every line is the container's, even one that looks like
    // the wrapper's init markers; its run markers are still kept out.
    let mut owner = LogOwner::new(false);
    assert!(owner.keeps("plain", None));
    assert!(owner.keeps("runpod-kubelet: container=x", None));
    assert!(owner.keeps("after", None));
    assert!(!owner.keeps("runpod-kubelet: exit-code=0", None));
    assert!(!init_progress(["plain"]).initialized);
    // A tail that starts inside a failed init container's output: those lines are its own.
    let tail = [
        "line 4999",
        "line 5000",
        "runpod-kubelet: init-exit-code=fetch=3",
        "runpod-kubelet: exit-code=3",
    ];
    let mut owner = LogOwner::for_window(tail);
    let fetch: Vec<&str> = tail
        .iter()
        .copied()
        .filter(|l| owner.keeps(l, Some("fetch")))
        .collect();
    assert_eq!(fetch, ["line 4999", "line 5000"]);
    let failed = init_progress(tail);
    assert!(
        !failed.initialized,
        "an init container's failure is no initialization"
    );
    // A tail that lost the mark: the command's own exit says they were done.
    let done = init_progress([
        "runpod-kubelet: init-exit-code=fetch=0",
        "output",
        "runpod-kubelet: exit-code=0",
    ]);
    assert!(done.initialized);
}
