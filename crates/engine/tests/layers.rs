//! The engine's layers depend only downward (ARCHITECTURE.md, "The engine's layers"):
//! every `crate::` path in a layer's sources names its own layer, a layer before it, or a
//! leaf module (`error`, `stats`). A path pointing down the list fails this test with the
//! file, the line and the two layers.

use std::path::{Path, PathBuf};

/// The layers in order; a layer may use itself and those before it.
const LAYERS: [&str; 12] = [
    "layout",
    "array",
    "write_log",
    "log",
    "index",
    "space",
    "io",
    "checkpoint",
    "cleaner",
    "mount",
    "maintenance",
    "volume",
];
/// Modules every layer may use, and which use no layer themselves.
const LEAVES: [&str; 4] = ["error", "queue", "stats", "write_lock"];

/// Each layer's components: the types only that layer implements. A method of a layer's
/// type is that layer's code, so an `impl` of it anywhere else would be a lower layer
/// reaching up (a call through a method names no `crate::` path) or an upper one reaching
/// in; the compiler keeps their fields private to the module that defines them.
const COMPONENTS: [(&str, &str); 12] = [
    ("Core", "io"),
    ("WriteState", "io"),
    ("SideBatch", "io"),
    ("LogState", "log"),
    ("SegmentTable", "space"),
    ("SegmentUse", "space"),
    ("CheckpointState", "index"),
    ("BlockMap", "index"),
    ("Checkpointer", "checkpoint"),
    ("Cleaner", "cleaner"),
    ("Maintenance", "maintenance"),
    ("Volume", "volume"),
];

/// The type an `impl` line implements (`impl Type`, `impl<'a> Type<'a>`, `impl Trait for
/// Type`), when the line starts one.
fn implemented_type(line: &str) -> Option<String> {
    let rest = line.trim_start().strip_prefix("impl")?;
    let rest = if rest.starts_with('<') { &rest[rest.find('>')? + 1..] } else { rest };
    if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let target = rest.split(" for ").last()?.trim();
    let path: String = target.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
    Some(path.rsplit("::").next()?.to_string())
}

fn rank(module: &str) -> Option<usize> {
    if LEAVES.contains(&module) {
        return Some(0);
    }
    LAYERS.iter().position(|layer| *layer == module).map(|index| index + 1)
}

fn sources(directory: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(directory).expect("read the engine's sources") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push(path);
        }
    }
}

/// The module a source file belongs to: its first path component below `src`.
fn owner(source_root: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(source_root).expect("inside src");
    let first = relative.components().next().expect("a component").as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

/// Every `crate::name` in `text` (comments included: a doc link down the list is a
/// dependency a reader follows too).
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(start) = rest.find("crate::") {
            let after = &rest[start + "crate::".len()..];
            let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // `crate::{a, b}` groups: every name inside the braces.
            if name.is_empty() && after.starts_with('{') {
                let inside: String = after[1..].chars().take_while(|c| *c != '}').collect();
                for part in inside.split(',') {
                    let module: String =
                        part.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    if !module.is_empty() {
                        found.push((number + 1, module));
                    }
                }
            } else if !name.is_empty() {
                found.push((number + 1, name));
            }
            rest = after;
        }
    }
    found
}

#[test]
fn every_layer_depends_only_on_the_layers_before_it() {
    let source_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&source_root, &mut files);
    files.sort();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in &files {
        let module = owner(&source_root, file);
        if module == "lib" {
            continue; // the crate root declares and re-exports every layer
        }
        let Some(own) = rank(&module) else {
            problems.push(format!(
                "{}: module `{module}` is in no layer (add it to ARCHITECTURE.md and here)",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read a source file");
        for (line, used) in crate_paths(&text) {
            checked += 1;
            let Some(used_rank) = rank(&used) else {
                problems.push(format!("{}:{line}: `crate::{used}` is in no layer", file.display()));
                continue;
            };
            let leaf_uses_layer = LEAVES.contains(&module.as_str()) && !LEAVES.contains(&used.as_str());
            if used_rank > own || leaf_uses_layer {
                problems.push(format!("{}:{line}: `{module}` uses `crate::{used}`, a later layer", file.display()));
            }
        }
    }
    assert!(checked > 100, "only {checked} crate paths found: the scan is broken");
    assert!(problems.is_empty(), "layering violations:\n{}", problems.join("\n"));
}

#[test]
fn a_component_is_implemented_only_in_its_own_layer() {
    let source_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&source_root, &mut files);
    let mut problems = Vec::new();
    let mut found = std::collections::BTreeSet::new();
    for file in &files {
        let module = owner(&source_root, file);
        let text = std::fs::read_to_string(file).expect("read a source file");
        for (number, line) in text.lines().enumerate() {
            let Some(implemented) = implemented_type(line) else { continue };
            if let Some((_, layer)) = COMPONENTS.iter().find(|(component, _)| *component == implemented) {
                found.insert(implemented.clone());
                if *layer != module {
                    problems.push(format!(
                        "{}:{}: `{implemented}` (layer `{layer}`) is implemented in `{module}`",
                        file.display(),
                        number + 1
                    ));
                }
            }
        }
    }
    assert_eq!(found.len(), COMPONENTS.len(), "some components were not found: the scan is broken ({found:?})");
    assert!(problems.is_empty(), "components implemented outside their layer:\n{}", problems.join("\n"));
}

#[test]
fn the_scan_sees_impl_lines() {
    assert_eq!(implemented_type("impl Core {").as_deref(), Some("Core"));
    assert_eq!(implemented_type("impl<'a> SideBatch<'a> {").as_deref(), Some("SideBatch"));
    assert_eq!(implemented_type("impl crate::log::pipeline::BatchSink for Core {").as_deref(), Some("Core"));
    assert_eq!(implemented_type("impl Drop for crate::io::Core {").as_deref(), Some("Core"));
    assert_eq!(implemented_type("implemented_type(line)"), None);
}

#[test]
fn the_scan_sees_paths_and_groups() {
    let paths = crate_paths("use crate::io::Core;\nuse crate::{layout, space::X};\n// see crate::volume::Volume");
    let names: Vec<&str> = paths.iter().map(|(_, name)| name.as_str()).collect();
    assert_eq!(names, ["io", "layout", "space", "volume"]);
    assert!(rank("volume") > rank("io"));
    assert_eq!(rank("stats"), Some(0));
}
