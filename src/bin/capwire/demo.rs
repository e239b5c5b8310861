//! `capwire demo`.

use crate::exit::Failure;

/// Arguments of `capwire demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// How many agents the cluster gets.
    #[arg(long, default_value_t = 3)]
    agents: usize,
}

pub(crate) async fn run(_args: DemoArgs) -> Result<(), Failure> {
    Err(Failure::failed("not yet"))
}
