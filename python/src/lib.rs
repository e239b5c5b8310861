//! The native half of the `capwire` Python package: nodes, peers and
//! handlers over capwire's Rust runtime. The Python half (`python/capwire`)
//! is the API; this module is not used directly.

mod args;
mod bench;
mod bridge;
mod errors;
mod handlers;
mod node;
mod peer;
mod value;

use pyo3::prelude::*;

#[pymodule]
fn _capwire(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(node::start_node, m)?)?;
    m.add_function(wrap_pyfunction!(peer::check_trace, m)?)?;
    m.add_class::<bridge::Bridge>()?;
    m.add_class::<node::Node>()?;
    m.add_class::<node::ConfigWatch>()?;
    m.add_class::<peer::Peer>()?;
    m.add_class::<peer::ItemStream>()?;
    m.add_class::<peer::TaskHandle>()?;
    m.add_class::<peer::EventStream>()?;
    m.add_class::<handlers::Context>()?;
    m.add_class::<handlers::TaskContext>()?;
    m.add_class::<handlers::ItemSink>()?;
    m.add_class::<handlers::Completion>()?;
    let bench = PyModule::new(m.py(), "bench")?;
    bench.add_function(wrap_pyfunction!(bench::rust_echo_node, &bench)?)?;
    bench.add_function(wrap_pyfunction!(bench::rust_calls, &bench)?)?;
    m.add_submodule(&bench)?;
    m.add("PROTOCOL_VERSION", capwire::envelope::PROTOCOL_V3)?;
    Ok(())
}
