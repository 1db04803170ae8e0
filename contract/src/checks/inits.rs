//! Which init containers a burst pod can run (in its one container, before its command).

use crate as contract;
use crate::pod::PodView;

/// Why the pod's init containers cannot run where a burst pod runs them: in its one container,
/// in order, before its command. So each must use the container's image (or the pod's
/// [`contract::INIT_IN_MAIN_IMAGE`] says any may run there), set its own `command`, mount only
/// what the container mounts where the container mounts it, and not be a sidecar; and the
/// container must set a command (the wrapper that runs them runs it next).
pub fn init_container_problems(pod: &PodView) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    let Some(main) = spec.containers.first() else {
        return Vec::new();
    };
    if inits.is_empty() {
        return Vec::new();
    }
    let never = format!("or set {}: never", contract::BURST_MODE);
    let mut problems = Vec::new();
    let any_image = pod
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(contract::INIT_IN_MAIN_IMAGE))
        .is_some_and(|v| v == "true");
    let main_mounts: Vec<(&str, &str)> = main
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.name.as_str(), m.mount_path.trim_end_matches('/')))
        .collect();
    if main.command.is_none() && main.args.is_none() {
        problems.push(format!(
            "its init containers run in its container before the container's command, but the \
             container sets no command: set `command` (the image's entrypoint), {never}"
        ));
    }
    let other_image: Vec<&str> = inits
        .iter()
        .filter(|init| !any_image && init.image != main.image)
        .map(|init| init.name.as_str())
        .collect();
    if !other_image.is_empty() {
        problems.push(format!(
            "it has init containers ({}) whose image is not the container's ({:?}), which \
             RunPod cannot run: a burst pod runs its init containers in its one container; use \
             the container's image, set {}: \"true\" if their commands exist in that image, \
             fold them into the container's command, {never}",
            other_image.join(", "),
            main.image.as_deref().unwrap_or_default(),
            contract::INIT_IN_MAIN_IMAGE,
        ));
    }
    for init in inits {
        let name = &init.name;
        if init.command.is_none() {
            problems.push(format!(
                "init container {name:?} sets no command (its image's entrypoint is not known \
                 here): set `command`, {never}"
            ));
        }
        if init.restart_policy.as_deref() == Some("Always") {
            problems.push(format!(
                "init container {name:?} is a sidecar (restartPolicy: Always), which a burst pod \
                 cannot run beside its container; {never}"
            ));
        }
        for mount in init.volume_mounts.iter().flatten() {
            let path = mount.mount_path.trim_end_matches('/');
            if !main_mounts.contains(&(mount.name.as_str(), path)) {
                problems.push(format!(
                    "init container {name:?} mounts volume {:?} at {path:?}, where the container \
                     does not mount it; a burst pod's init containers see the container's \
                     mounts: mount it there in the container too, {never}",
                    mount.name
                ));
            }
        }
    }
    problems
}
