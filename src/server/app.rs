//! `wick serve`: binds first (so `/health` answers 503 while the model
//! loads), loads the model on a blocking thread, starts the scheduler
//! thread, and shuts down gracefully on SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use super::config::ServeArgs;
use super::engine_loop::{self, EngineHandle};
use super::handlers;
use super::metrics::Metrics;
use super::validation::ModelContext;
use crate::chat_template::ChatTemplate;
use crate::engine::Engine;
use crate::tokenizer::Tokenizer;

/// Everything a handler needs once the model is loaded.
pub struct ModelState {
    pub name: String,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub vocab_size: usize,
    pub max_context: usize,
    pub engine: EngineHandle,
    pub metrics: Arc<Metrics>,
}

impl ModelState {
    pub fn context(&self) -> ModelContext<'_> {
        ModelContext {
            name: &self.name,
            vocab_size: self.vocab_size,
            max_context: self.max_context,
            tokenizer: &self.tokenizer,
            chat_template: self.chat_template.as_ref(),
        }
    }
}

pub struct AppState {
    /// Set once the model has loaded.
    pub model: OnceLock<Arc<ModelState>>,
    pub metrics: Arc<Metrics>,
    pub created: u64,
    pub shutting_down: AtomicBool,
    pub max_body_bytes: usize,
}

pub fn router(state: Arc<AppState>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/models", get(handlers::models))
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .route("/tokenize", post(handlers::tokenize))
        .route("/detokenize", post(handlers::detokenize))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

fn load(args: &ServeArgs, metrics: Arc<Metrics>) -> anyhow::Result<ModelState> {
    let path = args.model.model_path()?;
    let device = crate::loader::device(&args.model.device)?;
    let loaded = crate::loader::load(&path, &args.model.load_options(), &device)?;
    let info = loaded.model.info().clone();
    let engine = Engine::new(
        loaded.model,
        loaded.tokenizer.eos_ids().to_vec(),
        &args.model.engine.config(),
    )?;
    let name = args.served_model_name.clone().unwrap_or(loaded.name);
    metrics.set_model_name(&name);
    let (handle, _join) = engine_loop::spawn(engine, metrics.clone(), args.max_waiting);
    Ok(ModelState {
        name,
        tokenizer: loaded.tokenizer,
        chat_template: loaded.chat_template,
        vocab_size: info.vocab_size,
        max_context: info.max_context,
        engine: handle,
        metrics,
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

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .context("bad --host/--port")?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let metrics = Arc::new(Metrics::new());
    let state = Arc::new(AppState {
        model: OnceLock::new(),
        metrics: metrics.clone(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        shutting_down: AtomicBool::new(false),
        max_body_bytes: args.max_body_bytes,
    });
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
    let app = router(state.clone(), args.max_body_bytes);
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    let server = {
        let state = state.clone();
        axum::serve(listener, app).with_graceful_shutdown(async move {
            shutdown_signal().await;
            tracing::info!("shutting down: finishing in-flight requests (up to {grace:?})");
            state.shutting_down.store(true, Ordering::Relaxed);
            if let Some(m) = state.model.get() {
                m.engine.shutdown(grace);
            }
        })
    };
    let mut server = tokio::spawn(async move { server.await });
    tokio::select! {
        r = &mut server => return r.context("server task")?.context("serving"),
        r = loader => r.context("model loader")?.context("loading the model")?,
    }
    server.await.context("server task")?.context("serving")
}
