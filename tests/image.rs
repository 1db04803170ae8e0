//! The container image: `scripts/image.sh` builds the static binary and the image from the
//! Dockerfile with buildah (no daemon); the binary then runs from the image's own root
//! filesystem, which holds nothing else, and the image runs as a non-root user.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn buildah(storage: &Path, args: &[&str]) -> String {
    let out = Command::new("buildah")
        .args(["--storage-driver", "vfs", "--root"])
        .arg(storage)
        .arg("--runroot")
        .arg(storage.join("run"))
        .args(args)
        .output()
        .expect("running buildah");
    assert!(
        out.status.success(),
        "buildah {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn the_image_runs_its_static_binary_as_non_root() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let storage = tempfile::Builder::new().prefix("image-").tempdir().unwrap();
    let built = Command::new("bash")
        .arg(root.join("scripts/image.sh"))
        .arg("runpod-kubelet:test")
        .env("IMAGE_STORAGE", storage.path())
        // The image's make-up (static, alone, non-root) is the same at any optimisation; the
        // release build would only make this test several times slower.
        .env("IMAGE_PROFILE", "dev")
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "scripts/image.sh: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let user = buildah(
        storage.path(),
        &[
            "inspect",
            "--type",
            "image",
            "--format",
            "{{.OCIv1.Config.User}}",
            "runpod-kubelet:test",
        ],
    );
    assert_eq!(user, "65532:65532");
    let entrypoint = buildah(
        storage.path(),
        &[
            "inspect",
            "--type",
            "image",
            "--format",
            "{{.OCIv1.Config.Entrypoint}}",
            "runpod-kubelet:test",
        ],
    );
    assert_eq!(entrypoint, "[/runpod-kubelet]");

    let container = buildah(storage.path(), &["from", "runpod-kubelet:test"]);
    let mount = buildah(storage.path(), &["mount", &container]);
    let rootfs = Path::new(&mount);
    let entries: Vec<String> = std::fs::read_dir(rootfs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !["dev", "proc", "sys", "etc", "run"].contains(&name.as_str()))
        .collect();
    assert_eq!(
        entries,
        vec!["runpod-kubelet"],
        "the image holds only the binary"
    );
    let binary = rootfs.join("runpod-kubelet");
    // Static: nothing for a dynamic loader to do, so it runs without any library in the image.
    let ldd = Command::new("ldd").arg(&binary).output().unwrap();
    let ldd = format!(
        "{}{}",
        String::from_utf8_lossy(&ldd.stdout),
        String::from_utf8_lossy(&ldd.stderr)
    );
    assert!(
        ldd.contains("statically linked") || ldd.contains("not a dynamic executable"),
        "not static: {ldd}"
    );
    let version = Command::new(&binary).arg("--version").output().unwrap();
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("runpod-kubelet "));
    // It does real work from there: a CA and a serving certificate.
    let out = tempfile::tempdir().unwrap();
    let certs = Command::new(&binary)
        .args(["certs", "--out-dir"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        certs.status.success(),
        "{}",
        String::from_utf8_lossy(&certs.stderr)
    );
    assert!(out.path().join("tls.crt").exists());
    // The shipped binary links no cloud simulator: the subcommand does not exist.
    let help = Command::new(&binary).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("controller"), "{help}");
    assert!(
        !help.contains("simulator"),
        "the image's binary offers a simulator: {help}"
    );
    let simulator = Command::new(&binary)
        .args(["simulator", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(
        !simulator.status.success()
            && String::from_utf8_lossy(&simulator.stderr).contains("unrecognized subcommand"),
        "{}",
        String::from_utf8_lossy(&simulator.stderr)
    );
    let size = std::fs::metadata(&binary).unwrap().len();
    println!("image: one file, {:.1} MiB", size as f64 / 1024.0 / 1024.0);
    buildah(storage.path(), &["umount", &container]);
    buildah(storage.path(), &["rm", &container]);
}

/// `docker build .` and `scripts/image.sh` make the same image: the script builds the
/// Dockerfile's own final stage, only reading the binary from its context instead of the
/// builder stage, and the builder stage builds the binary the script builds (static, no
/// simulators, from the lock file) at the path the final stage copies.
#[test]
fn the_dockerfile_builds_from_source_and_its_final_stage_is_the_scripts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let (builder, final_stage) = dockerfile
        .split_once("\nFROM scratch\n")
        .expect("a FROM scratch final stage");
    let final_stage = format!("FROM scratch\n{final_stage}");
    let builder = builder.replace("\\\n", " ");
    assert!(builder.contains(" AS build\n"), "{builder}");
    for needed in [
        "COPY . .",
        "+crt-static",
        "--locked",
        "--no-default-features",
        "cp \"target/$target/release/runpod-kubelet\" /out/runpod-kubelet",
    ] {
        assert!(builder.contains(needed), "builder stage lacks {needed:?}");
    }
    assert!(final_stage.contains("USER 65532:65532\n"));

    let printed = Command::new("bash")
        .arg(root.join("scripts/image.sh"))
        .arg("--final-stage")
        .output()
        .unwrap();
    assert!(printed.status.success());
    let script = String::from_utf8(printed.stdout).unwrap();
    let differing: Vec<(&str, &str)> = final_stage
        .lines()
        .zip(script.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(final_stage.lines().count(), script.lines().count());
    assert_eq!(
        differing,
        vec![(
            "COPY --from=build --chmod=0555 /out/runpod-kubelet /runpod-kubelet",
            "COPY --chmod=0555 runpod-kubelet /runpod-kubelet"
        )]
    );
    let ignored = std::fs::read_to_string(root.join(".dockerignore")).unwrap();
    assert!(
        ignored.lines().any(|l| l == "target"),
        "the context skips target/"
    );
}
