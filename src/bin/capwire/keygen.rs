//! `capwire keygen`: makes a new node identity.

use std::path::PathBuf;

use capwire::Keypair;

use crate::exit::Failure;

/// Arguments of `capwire keygen`.
#[derive(Debug, clap::Args)]
pub(crate) struct KeygenArgs {
    /// Write the key here (mode 0600; an existing file is never replaced).
    /// Put it in a new state directory as `identity.key` to give that node
    /// this identity, or pass it to `capwire node --key`. Without it, the
    /// key file's text goes to stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

pub(crate) fn run(args: &KeygenArgs) -> Result<(), Failure> {
    let key = Keypair::generate().map_err(|e| Failure::failed(format!("no key: {e}")))?;
    match &args.out {
        Some(path) => {
            capwire::identity::write_key_file(path, &key)
                .map_err(|e| Failure::failed(format!("cannot write the key: {e}")))?;
            println!("{}", key.public());
        }
        None => {
            let secret = key.secret_bytes();
            // The hex digits live in a buffer that is wiped when it drops.
            let mut digits = zeroize::Zeroizing::new([0u8; 64]);
            let hex = base16ct::lower::encode_str(&secret[..], &mut digits[..])
                .map_err(|e| Failure::failed(format!("cannot encode the key: {e}")))?;
            println!("capwire-identity-v1\n{hex}");
            eprintln!("node id: {}", key.public());
        }
    }
    Ok(())
}
