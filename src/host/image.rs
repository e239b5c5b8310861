//! The children's image, built on this machine without a registry: the
//! `capwire` binary as it was built (glibc, dynamically linked), its
//! debug information stripped when `objcopy` is at hand, the shared
//! libraries `ldd` lists for it, a `passwd` naming the child's user, an
//! empty `/tmp`, and `/state` owned by the child's user with mode 0700.
//!
//! Docker fills a new named volume with what the image has at the mount
//! point, its owner and mode included: so a child's state volume starts
//! private to the child's user, as the node requires of a state
//! directory (a bare new volume is root's, mode 0755).
//!
//! The build context is one `Dockerfile` and one `rootfs.tar` (whose
//! entries carry their owners and modes; `ADD` unpacks it as it is):
//!
//! ```text
//! FROM scratch
//! ADD rootfs.tar /
//! USER 10001:10001
//! ENTRYPOINT ["/usr/local/bin/capwire"]
//! CMD ["node", "--state=/state", "--supervised"]
//! ```
//!
//! ```no_run
//! # async fn run() -> Result<(), capwire::host::HostError> {
//! use capwire::host::image::{ImageSpec, build};
//!
//! let built = build(&ImageSpec::new("target/release/capwire", "capwire:latest"), None).await?;
//! println!("{} ({} bytes)", built.tag, built.size);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use bollard::Docker;
use bollard::query_parameters::BuildImageOptions;
use futures_util::StreamExt;

use crate::host::HostError;
use crate::host::engine::{connect, engine_error, status_of};

pub use crate::host::engine::{CHILD_USER, DEFAULT_TAG};
/// Label: which binary the image was built from (its size and mtime),
/// so that a build of the same binary is skipped.
pub const LABEL_BINARY: &str = "capwire.binary";
/// Where the binary is in the image.
pub const BINARY_PATH: &str = "usr/local/bin/capwire";
const UID: u64 = 10001;

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageSpec {
    /// The `capwire` binary to put in the image.
    pub binary: PathBuf,
    /// The image's tag.
    pub tag: String,
    /// Build even if an image of this tag was built from this binary.
    pub force: bool,
}

impl ImageSpec {
    /// The image `tag` from `binary`.
    pub fn new(binary: impl Into<PathBuf>, tag: impl Into<String>) -> Self {
        Self {
            binary: binary.into(),
            tag: tag.into(),
            force: false,
        }
    }
}

/// A built image.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Built {
    /// Its tag.
    pub tag: String,
    /// Its id.
    pub id: String,
    /// Its size, in bytes, as the engine counts it.
    pub size: u64,
    /// `true` when the image built earlier from the same binary was kept.
    pub cached: bool,
}

fn io(what: &str, e: impl std::fmt::Display) -> HostError {
    HostError::Failed(format!("{what}: {e}"))
}

/// What identifies a binary: its size and modification time.
fn fingerprint(binary: &Path) -> Result<String, HostError> {
    let meta = std::fs::metadata(binary).map_err(|e| io(&binary.display().to_string(), e))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Ok(format!("{}-{mtime}", meta.len()))
}

/// The shared libraries the dynamic loader would load for `binary`, and
/// the loader itself, as `ldd` lists them (none for a static binary).
fn libraries(binary: &Path) -> Result<Vec<PathBuf>, HostError> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| io("running ldd", e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, right)) => right.trim().split(' ').next().unwrap_or(""),
            None => line.trim().split(' ').next().unwrap_or(""),
        };
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// The binary without its debug information (when `objcopy` is at hand).
fn stripped(binary: &Path, dir: &Path) -> PathBuf {
    let out = dir.join("capwire");
    let ok = std::process::Command::new("objcopy")
        .arg("--strip-debug")
        .arg(binary)
        .arg(&out)
        .status()
        .is_ok_and(|s| s.success());
    if ok { out } else { binary.to_path_buf() }
}

fn header(kind: tar::EntryType, mode: u32, uid: u64, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid);
    h.set_gid(uid);
    h.set_size(size);
    h.set_mtime(0);
    h.set_cksum();
    h
}

fn dir(t: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, uid: u64) -> Result<(), HostError> {
    let mut h = header(tar::EntryType::Directory, mode, uid, 0);
    t.append_data(&mut h, path, std::io::empty())
        .map_err(|e| io("writing the image", e))
}

fn file(
    t: &mut tar::Builder<Vec<u8>>,
    path: &str,
    mode: u32,
    data: &[u8],
) -> Result<(), HostError> {
    let mut h = header(tar::EntryType::Regular, mode, 0, data.len() as u64);
    t.append_data(&mut h, path, data)
        .map_err(|e| io("writing the image", e))
}

/// The root filesystem, as a tar whose entries carry owners and modes.
fn rootfs(binary: &Path) -> Result<Vec<u8>, HostError> {
    let tmp = tempfile::tempdir().map_err(|e| io("a temporary directory", e))?;
    let bin = stripped(binary, tmp.path());
    let mut t = tar::Builder::new(Vec::new());
    let mut made = std::collections::BTreeSet::new();
    let mut parents = |t: &mut tar::Builder<Vec<u8>>, path: &str| -> Result<(), HostError> {
        let mut at = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            if at.len() < path.len() && made.insert(at.clone()) {
                dir(t, &at, 0o755, 0)?;
            }
        }
        Ok(())
    };
    for path in ["etc/x", "tmp", "state"] {
        parents(&mut t, path)?;
    }
    dir(&mut t, "tmp", 0o1777, 0)?;
    dir(&mut t, "state", 0o700, UID)?;
    file(
        &mut t,
        "etc/passwd",
        0o644,
        format!("root:x:0:0::/:/nonexistent\ncapwire:x:{UID}:{UID}::/state:/nonexistent\n")
            .as_bytes(),
    )?;
    file(
        &mut t,
        "etc/group",
        0o644,
        format!("root:x:0:\ncapwire:x:{UID}:\n").as_bytes(),
    )?;
    let data = std::fs::read(&bin).map_err(|e| io(&bin.display().to_string(), e))?;
    parents(&mut t, BINARY_PATH)?;
    file(&mut t, BINARY_PATH, 0o755, &data)?;
    drop(data);
    for lib in libraries(binary)? {
        // The file itself (ldd names links), at the path the loader asks for.
        let data = std::fs::read(&lib).map_err(|e| io(&lib.display().to_string(), e))?;
        let path = lib.to_string_lossy().trim_start_matches('/').to_owned();
        parents(&mut t, &path)?;
        file(&mut t, &path, 0o755, &data)?;
    }
    t.into_inner().map_err(|e| io("writing the image", e))
}

/// The build context: the Dockerfile and the root filesystem.
fn context(binary: &Path, fingerprint: &str) -> Result<Vec<u8>, HostError> {
    let root = rootfs(binary)?;
    let dockerfile = format!(
        "FROM scratch\n\
         ADD rootfs.tar /\n\
         LABEL {LABEL_BINARY}=\"{fingerprint}\"\n\
         USER {CHILD_USER}\n\
         ENTRYPOINT [\"/{BINARY_PATH}\"]\n\
         CMD [\"node\", \"--state=/state\", \"--supervised\"]\n"
    );
    let mut t = tar::Builder::new(Vec::new());
    file(&mut t, "Dockerfile", 0o644, dockerfile.as_bytes())?;
    file(&mut t, "rootfs.tar", 0o644, &root)?;
    t.into_inner()
        .map_err(|e| io("writing the build context", e))
}

/// Builds the children's image from a `capwire` binary, with the engine
/// at `socket` (default: `DOCKER_HOST` or `/var/run/docker.sock`). An
/// image of the same tag built from the same binary is kept, unless
/// [`ImageSpec::force`].
///
/// # Errors
/// [`HostError::Unavailable`] when no engine answers; [`HostError::Failed`]
/// when the binary cannot be read or the build fails.
pub async fn build(spec: &ImageSpec, socket: Option<&PathBuf>) -> Result<Built, HostError> {
    let docker = connect(socket).await?;
    let print = fingerprint(&spec.binary)?;
    if !spec.force
        && let Ok(image) = docker.inspect_image(&spec.tag).await
    {
        let same = image
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get(LABEL_BINARY))
            .is_some_and(|l| *l == print);
        if same {
            return Ok(Built {
                tag: spec.tag.clone(),
                id: image.id.unwrap_or_default(),
                size: image.size.and_then(|s| u64::try_from(s).ok()).unwrap_or(0),
                cached: true,
            });
        }
    }
    let binary = spec.binary.clone();
    let context = tokio::task::spawn_blocking(move || context(&binary, &print))
        .await
        .map_err(|e| io("making the build context", e))??;
    let options = BuildImageOptions {
        dockerfile: "Dockerfile".to_owned(),
        t: Some(spec.tag.clone()),
        rm: true,
        forcerm: true,
        labels: Some(HashMap::new()),
        ..BuildImageOptions::default()
    };
    let mut stream =
        Box::pin(docker.build_image(options, None, Some(bollard::body_full(context.into()))));
    while let Some(step) = stream.next().await {
        let step = step.map_err(|e| engine_error("building the image", &e))?;
        if let Some(e) = step.error_detail.and_then(|d| d.message) {
            return Err(HostError::Failed(format!("building the image: {e}")));
        }
    }
    let image = docker
        .inspect_image(&spec.tag)
        .await
        .map_err(|e| engine_error("inspecting the built image", &e))?;
    Ok(Built {
        tag: spec.tag.clone(),
        id: image.id.unwrap_or_default(),
        size: image.size.and_then(|s| u64::try_from(s).ok()).unwrap_or(0),
        cached: false,
    })
}

/// `Ok` when the engine has `image`; otherwise says how to build it.
pub(crate) async fn require(docker: &Docker, image: &str) -> Result<(), HostError> {
    match docker.inspect_image(image).await {
        Ok(_) => Ok(()),
        Err(e) if status_of(&e) == Some(404) => Err(HostError::Unavailable(format!(
            "no image {image:?} on this Docker engine (no registry is asked): build it with \
             `capwire image build --tag {image}`"
        ))),
        Err(e) => Err(engine_error("looking for the image", &e)),
    }
}
