//! The router of `lacuna serve` and its OpenAPI document, both built from the typed handlers: a
//! route exists in the document exactly when it exists in the router. The document is one, whatever
//! the configuration: the bearer token is optional in it, since a server may run without one.
//! `serve/openapi.json` is a committed copy, checked equal to what is served.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::api::{self, Api};
use super::documents;
use super::http::{self as plumbing, RouteLabel};
use super::observe;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Lacuna",
        description = "Multi-hop questions answered with cited, verified facts. Questions are accepted at once (202) and answered asynchronously; every accepted question ends in exactly one record, an answer or an error. In process, accepted questions are held in memory (a restart loses them); over Kafka, 202 means the broker acknowledged the question. The /v1 routes need `Authorization: Bearer <token>` when the server is started with a token (serve.token_env), and nothing otherwise.",
    ),
    modifiers(&BearerToken),
    security((), ("bearer" = [])),
    tags(
        (name = "questions", description = "Ask, follow and read questions."),
        (name = "documents", description = "Add, read and delete documents of the live corpus, with a token of their own (off without one)."),
        (name = "operations", description = "The live page, this document, metrics and probes; no token needed."),
    )
)]
struct Document;

/// The optional bearer token of the /v1 routes.
struct BearerToken;

impl Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("Required when serve.token_env names a variable."))
            .build();
        components.add_security_scheme("bearer", SecurityScheme::Http(scheme));
        let documents = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("The document routes' own token, named by serve.documents_token_env."))
            .build();
        components.add_security_scheme("documents_bearer", SecurityScheme::Http(documents));
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", security(()), responses(
    (status = 200, description = "The OpenAPI document of this server.", content_type = "application/json", body = Object),
))]
async fn openapi_json(State(document): State<Arc<OnceLock<String>>>) -> Response {
    let document = document.get().cloned().unwrap_or_default();
    ([(CONTENT_TYPE, "application/json")], document).into_response()
}

/// The routes of `api` and the document that describes them.
pub fn router(api: Arc<Api>, ready: Arc<AtomicBool>) -> (Router, utoipa::openapi::OpenApi) {
    let document_text = Arc::new(OnceLock::new());
    let v1 = OpenApiRouter::new()
        .routes(routes!(api::post_questions, api::list_questions))
        .routes(routes!(api::get_question))
        .routes(routes!(api::events))
        .routes(routes!(api::answer))
        .routes(routes!(api::stages))
        .layer(middleware::from_fn_with_state(api.clone(), api::authorize))
        .with_state(api.clone());
    let documents = OpenApiRouter::new()
        .routes(routes!(documents::post_document))
        .routes(routes!(documents::get_document, documents::delete_document))
        .layer(middleware::from_fn_with_state(api.documents.clone(), documents::authorize))
        .with_state(api.documents.clone());
    let probes = OpenApiRouter::new()
        .routes(routes!(observe::metrics))
        .routes(routes!(observe::healthz))
        .routes(routes!(observe::readyz))
        .with_state(ready);
    let own = OpenApiRouter::new().routes(routes!(openapi_json)).with_state(document_text.clone());
    let (router, document) = OpenApiRouter::with_openapi(Document::openapi())
        .routes(routes!(api::page))
        .merge(own)
        .merge(probes)
        .merge(v1)
        .merge(documents)
        .split_for_parts();
    let text = serde_json::to_string_pretty(&document).expect("the document serialises");
    document_text.set(text + "\n").expect("set once");
    let router = router
        .route_layer(middleware::from_fn(label))
        .fallback(api::not_found)
        .layer(middleware::from_fn(plumbing::method_not_allowed))
        .layer(TraceLayer::new_for_http())
        .layer(plumbing::cors(&api.settings))
        .layer(middleware::from_fn(plumbing::count));
    (router, document)
}

/// Hands the matched route to the layers outside the router, which count requests by route.
async fn label(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map(|p| RouteLabel(p.as_str().to_string()));
    let mut response = next.run(request).await;
    if let Some(route) = route {
        response.extensions_mut().insert(route);
    }
    response
}
