//! BENCHMARKS.md is exactly what `scripts/bench.sh assemble` makes of `scripts/BENCHMARKS.md.in`
//! and the bench commands' tables in `bench-out/`: no table is edited by hand, none is missing,
//! and no marker is left unreplaced.

use std::path::Path;

/// The name in a `@@TABLE name@@` line (lowercase letters, digits and dashes), as the
/// assembler's pattern takes it.
fn marker(line: &str) -> Option<&str> {
    let name = line.strip_prefix("@@TABLE ")?.strip_suffix("@@")?;
    (!name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
    .then_some(name)
}

/// What the assembler writes: each marker line replaced by its table's lines (or a note where
/// the table is missing or empty), every other line as it is.
fn assemble(template: &str, tables: &Path) -> String {
    let mut out = String::new();
    for line in template.lines() {
        match marker(line) {
            Some(name) => match std::fs::read_to_string(tables.join(format!("{name}.md"))) {
                Ok(t) if !t.is_empty() => {
                    for l in t.lines() {
                        out.push_str(l);
                        out.push('\n');
                    }
                }
                _ => {
                    out.push_str(&format!(
                        "(not yet generated: run scripts/bench.sh {name})\n"
                    ));
                }
            },
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[test]
fn markers_are_the_assemblers() {
    assert_eq!(marker("@@TABLE kv@@"), Some("kv"));
    assert_eq!(marker("@@TABLE compare-long@@"), Some("compare-long"));
    assert_eq!(marker("@@TABLE Kv@@"), None);
    assert_eq!(marker(" @@TABLE kv@@"), None);
    assert_eq!(marker("@@TABLE @@"), None);
}

#[test]
fn benchmarks_md_is_the_assembly_of_the_bench_tables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let template = std::fs::read_to_string(root.join("scripts/BENCHMARKS.md.in")).unwrap();
    let doc = std::fs::read_to_string(root.join("BENCHMARKS.md")).unwrap();
    let tables = root.join("bench-out");
    let names: Vec<&str> = template.lines().filter_map(marker).collect();
    assert!(names.len() >= 10, "{names:?}");
    for name in &names {
        let t = tables.join(format!("{name}.md"));
        let text = std::fs::read_to_string(&t).unwrap_or_default();
        assert!(
            !text.trim().is_empty(),
            "{} is missing or empty: run scripts/bench.sh {name}",
            t.display()
        );
    }
    assert!(
        !doc.lines().any(|l| l.starts_with("@@TABLE")),
        "BENCHMARKS.md has a marker left: its name is not one the assembler takes"
    );
    let want = assemble(&template, &tables);
    if doc != want {
        let at = doc
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| doc.lines().count().min(want.lines().count()));
        panic!(
            "BENCHMARKS.md differs from scripts/bench.sh assemble's output from line {}: {:?} against {:?} (edit scripts/BENCHMARKS.md.in or rerun the bench, then scripts/bench.sh assemble)",
            at + 1,
            doc.lines().nth(at),
            want.lines().nth(at)
        );
    }
}
