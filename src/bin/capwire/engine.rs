//! The container hosts on the command line: `capwire node --host
//! docker|swarm` and its defaults for children, the placement flags of
//! `capwire ctl cluster create`, and `capwire image build`.

use std::net::IpAddr;

use capwire::manifest::Placement;

use crate::exit::Failure;

/// A size: bytes, or a number with `k`, `m` or `g` (powers of 1024),
/// e.g. `256m`.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (digits, unit) = match t.char_indices().last() {
        Some((i, 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'm')) => (&t[..i], 1 << 20),
        Some((i, 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 256m, 1g, 1048576)"))?;
    n.checked_mul(unit)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// CPUs, e.g. `0.5`, as thousandths of a CPU; more than 0.
pub(crate) fn parse_cpus(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a number of CPUs more than 0 (e.g. 0.5, 2)");
    let (whole, frac) = match text.trim().split_once('.') {
        Some((w, f)) => (w, f),
        None => (text.trim(), ""),
    };
    if whole.starts_with(['-', '+']) || frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let frac: u64 = format!("{frac:0<3}").parse().map_err(|_| bad())?;
    let milli = whole
        .checked_mul(1000)
        .and_then(|w| w.checked_add(frac))
        .ok_or_else(bad)?;
    if milli == 0 {
        return Err(bad());
    }
    Ok(milli)
}

/// Where and how a child runs: the flags `capwire node --host
/// docker|swarm` takes as its children's defaults, and `capwire ctl
/// cluster create` as one child's.
#[derive(Debug, Clone, Default, clap::Args, serde::Serialize, serde::Deserialize)]
pub(crate) struct PlacementArgs {
    /// (docker, swarm) The image to run (default: capwire:latest, made by
    /// `capwire image build`).
    #[arg(long, value_name = "IMAGE")]
    pub(crate) image: Option<String>,
    /// (docker, swarm) Memory limit, e.g. 256m.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) memory: Option<u64>,
    /// (docker, swarm) CPU limit, e.g. 0.5.
    #[arg(long, value_name = "CPUS", value_parser = parse_cpus, allow_hyphen_values = true)]
    pub(crate) cpus: Option<u64>,
    /// (docker, swarm) Most processes and threads.
    #[arg(long, value_name = "N")]
    pub(crate) pids: Option<u64>,
    /// (docker, swarm) Restarts of a failing child before it is reported
    /// exited for good.
    #[arg(long, value_name = "N")]
    pub(crate) restarts: Option<u32>,
    /// (swarm) A placement constraint, e.g. node.labels.zone==a; may be
    /// repeated.
    #[arg(long, value_name = "EXPR")]
    pub(crate) constraint: Vec<String>,
    /// (docker, swarm) A label KEY=VALUE; may be repeated.
    #[arg(long, value_name = "KEY=VALUE")]
    pub(crate) label: Vec<String>,
}

impl PlacementArgs {
    pub(crate) fn placement(&self) -> Placement {
        Placement {
            image: self.image.clone(),
            memory: self.memory,
            cpus_milli: self.cpus,
            pids: self.pids,
            restarts: self.restarts,
            constraints: self.constraint.clone(),
            labels: self.label.clone(),
        }
    }
}

/// `capwire node --host docker|swarm`: the children's defaults and
/// network.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct EngineArgs {
    #[command(flatten)]
    pub(crate) defaults: PlacementArgs,
    /// (docker, swarm) Children listen on this address of the host's
    /// network (default 127.0.0.1).
    #[arg(long, value_name = "IP")]
    pub(crate) child_ip: Option<IpAddr>,
    /// (docker, swarm) Attach children to this Docker network instead of
    /// the host's, each port published on --child-ip.
    #[arg(long, value_name = "NETWORK")]
    pub(crate) network: Option<String>,
}

fn config(args: &EngineArgs) -> capwire::host::EngineConfig {
    use capwire::host::{EngineConfig, Network};
    let mut cfg = EngineConfig::default();
    let d = args.defaults.placement();
    if let Some(image) = d.image {
        cfg.image = image;
    }
    cfg.defaults = Placement {
        image: None,
        memory: d.memory.or(cfg.defaults.memory),
        cpus_milli: d.cpus_milli.or(cfg.defaults.cpus_milli),
        pids: d.pids.or(cfg.defaults.pids),
        restarts: d.restarts.or(cfg.defaults.restarts),
        constraints: d.constraints,
        labels: d.labels,
    };
    let ip = args
        .child_ip
        .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    cfg.network = match &args.network {
        Some(network) => Network::Published {
            network: network.clone(),
            advertise: ip,
        },
        None => Network::Host { ip },
    };
    cfg
}

/// The node's children as containers (or Swarm services).
pub(crate) fn with_host(
    builder: capwire::NodeBuilder,
    swarm: bool,
    args: &EngineArgs,
) -> Result<capwire::NodeBuilder, Failure> {
    let cfg = config(args);
    Ok(if swarm {
        builder.host(capwire::host::SwarmHost::new(cfg))
    } else {
        builder.host(capwire::host::DockerHost::new(cfg))
    })
}

/// `capwire image build`.
#[derive(Debug, clap::Args)]
pub(crate) struct ImageArgs {
    #[command(subcommand)]
    op: ImageOp,
}

#[derive(Debug, clap::Subcommand)]
enum ImageOp {
    /// Builds the children's image from this capwire binary (or --binary),
    /// on the local Docker engine, without a registry: the binary, the
    /// libraries ldd lists, a non-root user and a private /state.
    Build {
        /// The image's tag.
        #[arg(long, default_value = "capwire:latest")]
        tag: String,
        /// The capwire binary to put in it (default: this one).
        #[arg(long, value_name = "FILE")]
        binary: Option<std::path::PathBuf>,
        /// Build even when the image was built from this binary already.
        #[arg(long)]
        force: bool,
    },
}

pub(crate) async fn image(args: ImageArgs) -> Result<(), Failure> {
    match args.op {
        ImageOp::Build { tag, binary, force } => build(tag, binary, force).await,
    }
}

async fn build(
    tag: String,
    binary: Option<std::path::PathBuf>,
    force: bool,
) -> Result<(), Failure> {
    let binary = match binary {
        Some(b) => b,
        None => std::env::current_exe()
            .map_err(|e| Failure::failed(format!("cannot find this program: {e}")))?,
    };
    let mut spec = capwire::host::image::ImageSpec::new(binary, tag);
    spec.force = force;
    let built = capwire::host::image::build(&spec, None)
        .await
        .map_err(|e| Failure::failed(e.to_string()))?;
    println!(
        "{} {} ({:.1} MB{})",
        built.tag,
        built.id,
        built.size as f64 / 1e6,
        if built.cached { ", already built" } else { "" }
    );
    Ok(())
}

/// The children's image, built from this program unless it was already
/// (for `capwire demo --host docker`).
pub(crate) async fn ensure_image() -> Result<(), Failure> {
    let binary = std::env::current_exe()
        .map_err(|e| Failure::failed(format!("cannot find this program: {e}")))?;
    let spec =
        capwire::host::image::ImageSpec::new(binary, capwire::host::image::DEFAULT_TAG.to_owned());
    capwire::host::image::build(&spec, None)
        .await
        .map(drop)
        .map_err(|e| Failure::failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_cpus() {
        assert_eq!(parse_size("256m"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("-1m").is_err());
        assert!(parse_size("lots").is_err());
        assert_eq!(parse_cpus("0.5"), Ok(500));
        assert_eq!(parse_cpus("2"), Ok(2000));
        assert_eq!(parse_cpus(".25"), Ok(250));
        for bad in ["0", "-0.5", "-1", "0.0001", "x", ""] {
            assert!(parse_cpus(bad).is_err(), "{bad}");
        }
    }
}
