//! gRPC tests: the layer in front of a tonic server, answered to a real tonic client over TCP on
//! 127.0.0.1, and the `grpc_server` example as a user runs it. Needs `--features tonic` (or
//! `--all-features`).

#[path = "../support/examples.rs"]
mod examples;

mod grpc_layer;
mod grpc_server_example;
