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

/// `wick serve --help` is a page, not a manual: each option is one line of
/// help under its heading (`--help` as `-h`), and what it leaves out is in
/// docs/deploy.md, which names every option.
#[test]
fn serve_help_is_one_line_an_option_and_the_docs_name_them_all() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for heading in ["Server:", "Model:", "Engine:"] {
        assert!(help.lines().any(|l| l == heading), "{heading}\n{help}");
    }
    let lines: Vec<&str> = help.lines().collect();
    let deploy = read("docs/deploy.md");
    let mut options = 0;
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line.trim_start().strip_prefix("--") else {
            continue;
        };
        let name = name.split(['[', ' ', '=']).next().unwrap();
        if name == "help" {
            continue;
        }
        options += 1;
        // The help on the option's line, or on the one line after it.
        let described = line.contains("  --") && line.split_whitespace().count() > 2
            || lines
                .get(i + 1)
                .is_some_and(|n| n.starts_with("          "));
        assert!(described, "--{name} has no help\n{help}");
        assert!(
            deploy.contains(&format!("--{name}")),
            "docs/deploy.md never names --{name}"
        );
    }
    assert!(options >= 39, "{options} options\n{help}");
    // At most two lines an option (its name, its help), and the headings.
    assert!(
        lines.len() <= 2 * options + 20,
        "{} lines\n{help}",
        lines.len()
    );
    assert!(help.contains("Port to listen on"), "{help}");
}
