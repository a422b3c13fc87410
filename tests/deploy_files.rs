//! The deployment files stay in step with the code they deploy.

use std::path::Path;

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap()
}

/// The Kubernetes ConfigMap carries `configs/default.toml` verbatim, so a
/// new option (or a changed default) reaches the cluster recipe too.
#[test]
fn the_configmap_holds_the_default_config() {
    let yaml = read("deploy/k8s/configmap.yaml");
    let (_, block) = yaml
        .split_once("  default.toml: |\n")
        .expect("a default.toml block scalar");
    let embedded: String = block
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    assert_eq!(embedded, read("configs/default.toml"));
}
