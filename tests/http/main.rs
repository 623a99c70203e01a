//! HTTP tests: the layer and its service over real connections, key extraction and spoofing, the
//! examples (`server`, `hyper`, `client`, `login`) as users run them, and the `playground` over its
//! JSON API and in headless Chromium.

#[path = "../support/examples.rs"]
mod examples;
#[path = "../support/login_rules.rs"]
mod login_rules;
#[path = "../support/logs.rs"]
mod logs;
#[path = "../support/http.rs"]
mod support;

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/client.rs"]
mod example_client;
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/login.rs"]
mod example_login;

mod concurrency_limit;
mod http_examples;
mod http_layer;
mod ietf_draft_examples;
mod ietf_fields;
mod keys_spoofing;
mod layer_future;
mod layer_hooks;
mod layer_metrics;
mod layer_misconfig;
mod layer_service;
mod login;
mod per_request_rules;
mod pipeline_matrix;
mod playground;
mod problem_json;
mod rules_concurrency;
mod rules_file;
mod rules_many;
mod rules_queue_and_reset;
mod rules_settle;
mod rules_tiers;
mod rules_trailer_settle;
mod server_cli;
mod settle_from_response;
mod settlement;
mod shaping_queue;
mod stacked_headers;
mod window_offset_layer;
