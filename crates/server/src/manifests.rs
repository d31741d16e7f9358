//! Reading manifest files from disk for `apply -f FILE|DIR` and `serve --apply DIR`.

use std::path::Path;

use pcmail_core::api::ManifestFile;

/// A file, or every `*.yaml`/`*.yml` under a directory (recursively), in path order so that
/// the result does not depend on the file system's listing order. O4: entries whose name starts
/// with `.` are skipped and symlinks followed, each file read once however many links lead to it
/// — a Kubernetes ConfigMap mount holds a hidden `..2026_…` folder, a `..data` link to it and a
/// link per file, which must apply as the files they are, once.
pub fn read_path(path: &Path) -> std::io::Result<Vec<ManifestFile>> {
    let mut paths = Vec::new();
    collect(path, &mut paths)?;
    paths.sort();
    let mut seen = std::collections::BTreeSet::new();
    paths.retain(|p| seen.insert(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())));
    if paths.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no .yaml or .yml files in {}", path.display()),
        ));
    }
    paths
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p)?;
            let content = String::from_utf8(bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: not valid UTF-8 (at byte {})", p.display(), e.utf8_error().valid_up_to()),
                )
            })?;
            Ok(ManifestFile { name: p.display().to_string(), content })
        })
        .collect()
}

fn collect(path: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    let meta =
        std::fs::metadata(path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    if meta.is_file() {
        out.push(path.to_path_buf());
    } else {
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let p = entry.path();
            let is_yaml = p.extension().is_some_and(|e| e == "yaml" || e == "yml");
            if p.is_dir() {
                collect(&p, out)?;
            } else if is_yaml {
                out.push(p);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use super::*;

    /// The layout the kubelet makes of a ConfigMap volume, as `mkdir` and `ln -s` make it.
    fn configmap_layout(dir: &Path, files: &[(&str, &str)]) {
        let data = dir.join("..2026_11_30_22_09_00.123456789");
        std::fs::create_dir_all(&data).expect("data dir");
        for (name, content) in files {
            std::fs::write(data.join(name), content).expect("file");
        }
        std::os::unix::fs::symlink(data.file_name().expect("name"), dir.join("..data")).expect("..data");
        for (name, _) in files {
            std::os::unix::fs::symlink(Path::new("..data").join(name), dir.join(name)).expect("link");
        }
    }

    #[test]
    fn o4_a_configmap_mount_reads_each_manifest_once_through_its_links() {
        let dir = tempfile::tempdir().expect("tempdir");
        configmap_layout(dir.path(), &[("roster.yaml", "a: 1\n"), ("work.yaml", "b: 2\n")]);
        let files = read_path(dir.path()).expect("read");
        let names: Vec<String> =
            files.iter().map(|f| f.name.rsplit('/').next().unwrap_or_default().to_string()).collect();
        assert_eq!(names, ["roster.yaml", "work.yaml"]);
        assert_eq!(files[0].content, "a: 1\n");
    }
}
