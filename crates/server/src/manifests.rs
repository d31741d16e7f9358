//! Reading manifest files from disk for `apply -f FILE|DIR` and `serve --apply DIR`.

use std::path::Path;

use pcmail_core::api::ManifestFile;

/// A file, or every `*.yaml`/`*.yml` under a directory (recursively), in path order so that
/// the result does not depend on the file system's listing order.
pub fn read_path(path: &Path) -> std::io::Result<Vec<ManifestFile>> {
    let mut paths = Vec::new();
    collect(path, &mut paths)?;
    paths.sort();
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
            let p = entry?.path();
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
