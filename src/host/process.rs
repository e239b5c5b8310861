//! The process host: each child is a supervised `capwire node` process.
