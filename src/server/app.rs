//! `wick serve`: binds first (so `/health` answers 503 while the model
//! loads), loads the model on a blocking thread, starts the scheduler
//! thread, and shuts down gracefully on SIGINT/SIGTERM. The router and its
//! layers (request id, tracing, access log, CORS, API key, panic guard) are
//! assembled here.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::watch;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::engine::Engine;
use crate::media::fetch::MediaAccess;
use crate::sampling::constraint::ConstraintFactory;
use crate::server::anthropic::messages;
use crate::server::config::ServeArgs;
use crate::server::engine_loop;
use crate::server::error::ApiError;
use crate::server::handlers;
use crate::server::http::access;
use crate::server::http::auth::{self, ApiKeys};
use crate::server::http::host_check::{self, AllowedHosts};
use crate::server::http::listener::{self, ConnectionLimits};
use crate::server::images::ImageBudget;
use crate::server::metrics::Metrics;
use crate::server::openai::chat;
use crate::server::openai::completions;
use crate::server::openai::embeddings;
use crate::server::openai::responses;
use crate::server::openapi;
use crate::server::state::{AppState, ModelState, RequestLimits};
use crate::server::webui;

/// Everything between a connection and the handlers.
pub struct RouterConfig {
    pub api_keys: Vec<String>,
    /// `*` alone allows any origin; none, no CORS.
    pub allowed_origins: Vec<String>,
    pub allowed_hosts: AllowedHosts,
    /// The chat page at `/`.
    pub webui: bool,
}

pub fn router(state: Arc<AppState>, cfg: &RouterConfig) -> anyhow::Result<Router> {
    let kept = responses::Kept::for_owners(cfg.api_keys.len());
    // Built once: the same bytes for every request.
    let openapi = axum::body::Bytes::from(openapi::document().to_string());
    let mut api = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::create_response))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        // Anthropic's API answers even a wrong method in its own shape.
        .route(
            "/v1/messages",
            post(messages::messages).fallback(messages::method_not_allowed),
        )
        .route(
            "/v1/messages/count_tokens",
            post(messages::count_tokens).fallback(messages::method_not_allowed),
        )
        .route("/v1/models", get(handlers::models))
        // Hub-style names (`ORG/NAME`) hold a slash.
        .route("/v1/models/{*id}", get(handlers::model))
        .route("/tokenizer_info", get(handlers::tokenizer_info))
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .route("/tokenize", post(handlers::tokenize))
        .route("/detokenize", post(handlers::detokenize))
        .route(
            "/openapi.json",
            get(move || async move { ([(CONTENT_TYPE, "application/json")], openapi) }),
        )
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.limits.max_body_bytes))
        .layer(axum::Extension(kept))
        .with_state(state);
    if !cfg.api_keys.is_empty() {
        let keys = ApiKeys::new(cfg.api_keys.clone());
        api = api.layer(middleware::from_fn_with_state(keys, auth::require_api_key));
    }
    if cfg.webui {
        api = api.merge(webui::routes());
    }
    // Listed outermost first: every request gets an id before anything
    // logs, and CORS headers go on refusals (401, panics) too, so a browser
    // page can read them.
    let layers = ServiceBuilder::new()
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(middleware::from_fn(access::sanitize_request_id))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &axum::http::Request<_>| {
                    tracing::info_span!("request", id = %access::request_id(req.headers()))
                })
                .on_failure(log_failure),
        )
        .layer(middleware::from_fn(access::log_access))
        .option_layer(cors(&cfg.allowed_origins)?)
        .layer(middleware::from_fn_with_state(
            cfg.allowed_hosts.clone(),
            host_check::check_host,
        ))
        .layer(CatchPanicLayer::custom(panic_response));
    Ok(api.layer(layers))
}

fn cors(origins: &[String]) -> anyhow::Result<Option<CorsLayer>> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list = origins
            .iter()
            .map(|o| {
                HeaderValue::from_str(o)
                    .with_context(|| format!("bad --allowed-origins entry {o:?}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        AllowOrigin::list(list)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods(Any)
            .allow_headers(Any)
            .expose_headers([HeaderName::from_static("x-request-id")]),
    ))
}

/// A 503 is expected (`/health` while the model loads, a full queue,
/// shutdown) and says so to the client, so it is no error of the
/// server's: debug level (the access log has every status). Other failures
/// are errors.
fn log_failure(class: ServerErrorsFailureClass, latency: Duration, _span: &tracing::Span) {
    let ms = latency.as_millis();
    match class {
        ServerErrorsFailureClass::StatusCode(StatusCode::SERVICE_UNAVAILABLE) => {
            tracing::debug!(latency_ms = ms, "503 Service Unavailable");
        }
        class => tracing::error!(classification = %class, latency_ms = ms, "response failed"),
    }
}

/// A panicking handler fails its own request with a 500, never the server.
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    let detail = crate::error::panic_message(panic.as_ref());
    tracing::error!("handler panicked: {detail}");
    ApiError::internal("internal error while handling the request").into_response()
}

/// Requests whose image URLs are being fetched at once; more wait. Each
/// holds a blocking thread for up to `--media-fetch-timeout-secs` and up
/// to 8 images of 8 MiB, so this bounds both the threads taken from the
/// pool validation runs on and the memory fetched bytes hold (512 MiB).
const MAX_FETCHING: usize = 8;

fn load(args: &ServeArgs, metrics: Arc<Metrics>) -> anyhow::Result<ModelState> {
    let media_access = MediaAccess::new(
        &args.allowed_media_domains,
        args.allowed_local_media_path.as_deref(),
        Duration::from_secs(args.media_fetch_timeout_secs),
    )?;
    let path = args.model.model_path()?;
    let device = crate::load::loader::device(&args.model.device)?;
    let options = crate::load::loader::LoadOptions {
        context: args.max_model_len,
        ..args.model.load_options()
    };
    let loaded = crate::load::loader::load(&path, &options, &device)?;
    let info = loaded.model.info().clone();
    let max_context = match args.max_model_len {
        Some(n) if n > info.max_context => anyhow::bail!(
            "--max-model-len {n} is larger than the model's context of {} tokens",
            info.max_context
        ),
        Some(0) => anyhow::bail!("--max-model-len must be at least 1"),
        Some(n) => n,
        None => info.max_context,
    };
    let engine = Engine::new(
        loaded.model,
        loaded.tokenizer.eos_ids().to_vec(),
        &args.model.engine.config(),
    )?;
    let engine = match loaded.vision {
        Some(encoder) => engine.with_vision(encoder),
        None => engine,
    };
    let engine = args.model.with_draft(engine, &options, &device)?;
    let image_spec = engine.image_spec().cloned();
    let mut names = args.served_model_name.iter().filter(|n| !n.is_empty());
    let name = names.next().cloned().unwrap_or(loaded.name);
    let aliases = names.filter(|&n| *n != name).cloned().collect();
    metrics.set_model_name(&name);
    if let Some(load) = engine.model().expert_load() {
        metrics.set_expert_load(load);
    }
    let max_seq_tokens = engine.max_seq_tokens();
    let (handle, _join) = engine_loop::spawn(engine, metrics.clone(), args.max_waiting);
    let max_num_seqs = args.model.engine.max_num_seqs;
    let constraints = ConstraintFactory::new(&loaded.tokenizer)
        .inspect_err(|e| tracing::warn!("constrained output is unavailable: {e:#}"))
        .ok();
    Ok(ModelState {
        name,
        aliases,
        tokenizer: loaded.tokenizer,
        chat_template: loaded.chat_template,
        image_spec,
        image_budget: ImageBudget {
            max_images: args.max_images_per_request,
            ..ImageBudget::default()
        },
        media_access: Arc::new(media_access),
        fetching: Arc::new(tokio::sync::Semaphore::new(MAX_FETCHING)),
        vocab_size: info.vocab_size,
        max_context,
        max_seq_tokens,
        max_choices: max_num_seqs + args.max_waiting,
        pooling: args.pooling,
        engine: handle,
        metrics,
        constraints,
        tokenizing: Arc::new(tokio::sync::Semaphore::new(
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        )),
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

/// Raises the soft open-file limit to the hard one (many systems start
/// servers at 1024) and returns it.
fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    lim.rlim_cur
}

/// File descriptors kept for everything but client connections (the model
/// files, the listener, blocking threads' files, refusals in flight).
const RESERVED_FDS: u64 = 128;

/// What the response to a cut-off shutdown still needs after the grace
/// period: the engine's aborts reach their handlers and are written out.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(2);

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .context("bad --host/--port")?;
    let fd_limit = raise_fd_limit();
    let max_connections = if args.max_connections as u64 + RESERVED_FDS > fd_limit {
        let fit = fd_limit.saturating_sub(RESERVED_FDS).max(1) as usize;
        tracing::warn!(
            "--max-connections {} does not fit the open-file limit {fd_limit}: using {fit}",
            args.max_connections
        );
        fit
    } else {
        args.max_connections
    };
    let router_cfg = RouterConfig {
        api_keys: args.api_keys()?,
        allowed_origins: args.allowed_origins.clone(),
        allowed_hosts: AllowedHosts::new(&args.allowed_hosts, &args.host),
        webui: !args.no_webui,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let metrics = Arc::new(Metrics::new());
    let client_timeout = Duration::from_secs(args.client_timeout_secs);
    let state = Arc::new(AppState {
        model: OnceLock::new(),
        metrics: metrics.clone(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        shutting_down: watch::Sender::new(false),
        limits: RequestLimits {
            max_body_bytes: args.max_body_bytes,
            client_timeout,
            request_timeout: args.request_timeout_secs.map(Duration::from_secs),
            sse_keep_alive: Duration::from_secs(args.sse_keep_alive_secs.max(1)),
        },
    });
    let app = router(state.clone(), &router_cfg)?;
    // Tests and scripts read the bound address (the port may be 0) from here.
    println!("wick listening on http://{}", listener.local_addr()?);

    let loader = {
        let (state, args) = (state.clone(), args.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let model = load(&args, state.metrics.clone())?;
            tracing::info!("model {} loaded", model.name);
            let _ = state.model.set(Arc::new(model));
            Ok(())
        })
    };
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    let limits = ConnectionLimits {
        max_connections,
        client_timeout,
        max_header_bytes: args.max_header_bytes,
    };
    let shutdown = {
        let state = state.clone();
        async move {
            shutdown_signal().await;
            tracing::info!("shutting down: finishing in-flight requests (up to {grace:?})");
            state.shutting_down.send_replace(true);
            if let Some(m) = state.model.get() {
                m.engine.shutdown(grace);
            }
        }
    };
    let mut server = tokio::spawn(listener::serve(
        listener,
        app,
        limits,
        shutdown,
        grace + SHUTDOWN_SLACK,
    ));
    tokio::select! {
        r = &mut server => return r.context("server task"),
        r = loader => r.context("model loader")?.context("loading the model")?,
    }
    server.await.context("server task")
}
