//! The generated code of `proto/berth/v1.proto`, client and server.
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("berth.v1");
