//! The completion wrapper. RunPod restarts a container whose process exits (its pods are meant
//! to run until stopped), so a batch container would run again and again. The wrapper runs the
//! pod's command under `sh`, prints `runpod-kubelet: exit-code=<N>` as its last line, and stops
//! its own RunPod pod through the pod-scoped key RunPod injects (`runpodctl` and
//! `$RUNPOD_POD_ID`). The controller sees the pod EXITED in its list and reads the code from the
//! log. If the self-stop fails, the wrapper just ends: RunPod restarts the container and the
//! controller, seeing the uptime go back, still finds the code in the log.

/// The prefix of the wrapper's last log line; the simulator and the controller look for it.
pub const EXIT_CODE_PREFIX: &str = "runpod-kubelet: exit-code=";

/// `$0` of the wrapper script, so `ps` shows what runs.
const SCRIPT_NAME: &str = "runpod-kubelet-wrapper";

/// Run once, report, stop (restartPolicy Never).
const RUN_ONCE: &str = r#""$@"; code=$?
echo "runpod-kubelet: exit-code=$code"
if [ -n "${RUNPOD_POD_ID:-}" ] && command -v runpodctl >/dev/null 2>&1; then
  runpodctl stop pod "$RUNPOD_POD_ID" >/dev/null 2>&1
fi
exit "$code""#;

/// Run until it succeeds, reporting every exit, then stop (restartPolicy OnFailure).
const UNTIL_SUCCESS: &str = r#"while :; do
  "$@"; code=$?
  echo "runpod-kubelet: exit-code=$code"
  [ "$code" -eq 0 ] && break
  sleep 10
done
if [ -n "${RUNPOD_POD_ID:-}" ] && command -v runpodctl >/dev/null 2>&1; then
  runpodctl stop pod "$RUNPOD_POD_ID" >/dev/null 2>&1
fi
exit 0"#;

/// How a pod's container ends, from its `restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// `Never`: run once.
    RunOnce,
    /// `OnFailure`: run again after a failure, end after a success.
    UntilSuccess,
    /// `Always`: never ends; RunPod's own restarts do the job, no wrapper.
    Forever,
}

/// Prefix of the env vars that carry mounted files' contents (base64), one per file.
pub const FILE_ENV_PREFIX: &str = "RUNPOD_KUBELET_FILE_";

/// Exit code reported when the volume files cannot be written (as a shell reports a command
/// that cannot run).
pub const SETUP_FAILED_CODE: i32 = 126;

/// A file the wrapper writes before the command runs.
pub struct FileToWrite<'a> {
    pub path: &'a str,
    pub content: &'a [u8],
    pub mode: u32,
}

/// Shell that writes a pod's mounted files, and the env that carries their contents. Contents
/// travel in env, never in `args`, so they are not in the command line RunPod shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    script: String,
    pub env: std::collections::BTreeMap<String, String>,
}

impl Setup {
    /// `None` when there is nothing to write.
    pub fn new(files: &[FileToWrite<'_>], directories: &[String]) -> Result<Option<Setup>, String> {
        use base64::Engine as _;
        if files.is_empty() && directories.is_empty() {
            return Ok(None);
        }
        let quote = |text: &str| {
            shlex::try_quote(text)
                .map(|q| q.into_owned())
                .map_err(|e| format!("path {text:?}: {e}"))
        };
        let mut steps = Vec::new();
        let mut env = std::collections::BTreeMap::new();
        for directory in directories {
            steps.push(format!("mkdir -p {}", quote(directory)?));
        }
        for (index, file) in files.iter().enumerate() {
            let var = format!("{FILE_ENV_PREFIX}{index}");
            let parent = file.path.rsplit_once('/').map_or("/", |(dir, _)| dir);
            let parent = if parent.is_empty() { "/" } else { parent };
            let path = quote(file.path)?;
            steps.push(format!(
                "mkdir -p {parent} && printf '%s' \"${var}\" | base64 -d > {path} && chmod {mode:o} {path}",
                parent = quote(parent)?,
                mode = file.mode & 0o777,
            ));
            env.insert(
                var,
                base64::engine::general_purpose::STANDARD.encode(file.content),
            );
        }
        let unset: Vec<&str> = env.keys().map(String::as_str).collect();
        let script = format!(
            "runpod_kubelet_setup() {{\n  {steps}\n}}\n\
             runpod_kubelet_setup || {{ echo \"runpod-kubelet: could not write the pod's volume files \
             (the image needs sh, mkdir, base64 and a writable filesystem)\" >&2; \
             set -- sh -c 'exit {SETUP_FAILED_CODE}'; }}\n{unset}",
            steps = steps.join(" &&\n  "),
            unset = if unset.is_empty() {
                String::new()
            } else {
                format!("unset {}\n", unset.join(" "))
            },
        );
        Ok(Some(Setup { script, env }))
    }
}

/// The v2 `args` string that runs `words` under the wrapper, or `None` when the pod is not
/// wrapped (nothing to set up and no command to wrap, or it runs forever anyway). With a
/// `setup`, the files are written first; a pod that needs files but has no command cannot be
/// wrapped, which is an error (the image's own CMD is unknown here).
pub fn wrapped_args(
    words: &[String],
    completion: Completion,
    setup: Option<&Setup>,
) -> Result<Option<String>, String> {
    let body = match completion {
        Completion::Forever => "exec \"$@\"",
        Completion::RunOnce => RUN_ONCE,
        Completion::UntilSuccess => UNTIL_SUCCESS,
    };
    if words.is_empty() {
        return match setup {
            None => Ok(None),
            Some(_) => Err(
                "the pod mounts configMap, secret, downwardAPI or emptyDir volumes, \
                 which are written by a wrapper around the container's command, but the \
                 container sets no command or args: set `command` (the image's entrypoint)"
                    .into(),
            ),
        };
    }
    let script = match (setup, completion) {
        (None, Completion::Forever) => return Ok(None),
        (None, _) => body.to_owned(),
        (Some(setup), _) => format!("{}{body}", setup.script),
    };
    let all = ["sh", "-c", script.as_str(), SCRIPT_NAME]
        .into_iter()
        .chain(words.iter().map(String::as_str));
    shlex::try_join(all).map(Some).map_err(|e| e.to_string())
}

/// The exit code the wrapper reported last in `lines`, if any.
pub fn exit_code<'a>(lines: impl IntoIterator<Item = &'a str>) -> Option<i32> {
    lines
        .into_iter()
        .filter_map(|line| line.trim().strip_prefix(EXIT_CODE_PREFIX))
        .filter_map(|code| code.trim().parse::<i32>().ok())
        .last()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn wrapped_args_split_back_into_the_script_and_the_exact_words() {
        let original = words(&["python", "train.py", "--name", "it's a \"test\" $HOME"]);
        let args = wrapped_args(&original, Completion::RunOnce, None)
            .unwrap()
            .unwrap();
        let split = shlex::split(&args).unwrap();
        assert_eq!(split[0..2], ["sh", "-c"]);
        assert!(split[2].contains(EXIT_CODE_PREFIX));
        assert!(split[2].contains("runpodctl stop pod"));
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
        let args = wrapped_args(
            &words(&["sh", "-c", "echo hi; exit 3"]),
            Completion::RunOnce,
            None,
        )
        .unwrap()
        .unwrap();
        let argv = shlex::split(&args).unwrap();
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
    }

    #[test]
    fn until_success_runs_again_after_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran-once");
        let command = format!(
            "if [ -e {m} ]; then exit 0; else touch {m}; exit 4; fi",
            m = marker.display()
        );
        let args = wrapped_args(
            &words(&["sh", "-c", &command]),
            Completion::UntilSuccess,
            None,
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

    #[test]
    fn forever_and_commandless_pods_are_not_wrapped() {
        assert_eq!(
            wrapped_args(&words(&["serve"]), Completion::Forever, None),
            Ok(None)
        );
        assert_eq!(wrapped_args(&[], Completion::RunOnce, None), Ok(None));
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
            let args = wrapped_args(&words(&["sh", "-c", &command]), completion, Some(&setup))
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
        let args = wrapped_args(&words(&["echo", "ran"]), Completion::RunOnce, Some(&setup))
            .unwrap()
            .unwrap();
        let output = run_script(&args, &setup.env);
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert_eq!(stdout, "runpod-kubelet: exit-code=126\n");
        assert!(
            String::from_utf8_lossy(&output.stderr)
                .contains("could not write the pod's volume files")
        );
    }

    #[test]
    fn files_without_a_command_cannot_be_wrapped() {
        let setup = Setup::new(&[], &["/scratch".to_owned()]).unwrap().unwrap();
        let error = wrapped_args(&[], Completion::Forever, Some(&setup)).unwrap_err();
        assert!(error.contains("set `command`"), "{error}");
        assert_eq!(Setup::new(&[], &[]), Ok(None));
    }
}
