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

/// The v2 `args` string that runs `words` under the wrapper, or `None` when the pod is not
/// wrapped (no command to wrap, or it runs forever anyway).
pub fn wrapped_args(words: &[String], completion: Completion) -> Result<Option<String>, String> {
    let script = match completion {
        Completion::Forever => return Ok(None),
        Completion::RunOnce => RUN_ONCE,
        Completion::UntilSuccess => UNTIL_SUCCESS,
    };
    if words.is_empty() {
        return Ok(None);
    }
    let all = ["sh", "-c", script, SCRIPT_NAME]
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
        let args = wrapped_args(&original, Completion::RunOnce)
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
        let args = wrapped_args(&words(&["sh", "-c", &command]), Completion::UntilSuccess)
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
            wrapped_args(&words(&["serve"]), Completion::Forever),
            Ok(None)
        );
        assert_eq!(wrapped_args(&[], Completion::RunOnce), Ok(None));
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
}
