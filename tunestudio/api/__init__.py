"""The HTTP API: `create_app(settings)` builds the FastAPI app (routes, SSE, the web page)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles

from tunestudio.api import errors
from tunestudio.api.chat_warmup import ChatWarmup
from tunestudio.api.deps import require_token
from tunestudio.api.judging import pool_answerer
from tunestudio.api.routes import (
    arena,
    audio,
    benchmarks,
    chat,
    completions,
    datasets,
    downloads,
    files,
    fine_tuning,
    jobfile,
    jobs,
    judgements,
    logs,
    make_data,
    models,
    openai,
    resources,
    rewards,
    sweeps,
    system,
    train,
    uploads,
    web,
)
from tunestudio.api.schemas import ERRORS
from tunestudio.api.security import BodyLimit, RequestGuard
from tunestudio.arena import FILE as ARENA
from tunestudio.arena import Arena
from tunestudio.inference import InferencePool, UnknownModel, resolve
from tunestudio.jobs import RUNNING, JobManager, inference_executor
from tunestudio.judge import FOLDER as JUDGEMENTS
from tunestudio.judge import Judgements
from tunestudio.settings import Settings
from tunestudio.sweeps import Sweeps

STATIC = Path(__file__).parent / "static"
# The page's charting library, installed by `npm install` in api/web (make setup); never committed.
VENDOR = Path(__file__).parent / "web" / "node_modules" / "uplot" / "dist"


def create_app(settings: Settings | None = None, manager: JobManager | None = None) -> FastAPI:
    """The app. A given manager is used as it is (tests); otherwise one is made and closed with the app."""
    settings = settings or Settings()
    app = FastAPI(title="tunestudio", version="0.1.0", lifespan=_lifespan(settings, manager), responses=ERRORS,
                  description="Fine-tune language models locally: jobs, live events, metrics.")
    app.state.settings = settings
    errors.install(app)
    _include_routers(app)
    _guard(app, settings)
    _mount_static(app)
    return app


def _lifespan(settings: Settings, manager: JobManager | None) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """What the app starts and closes: the manager (unless given), the chat workers, sweeps, judgements, the arena."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = manager is None
        app.state.manager = manager or JobManager(settings)
        app.state.manager.start()
        jobs_manager = app.state.manager
        # On a GPU the chat worker gives the device back while a job (of any process on this data directory) trains.
        # A benchmark is no training: it asks this very worker, which must stay loaded for it.
        app.state.inference = InferencePool(
            settings, inference_executor,
            training_active=lambda: any(j.kind != "bench" for j in jobs_manager.list(list(RUNNING), limit=100)))
        # Sweeps left live by an earlier server continue; their runners stop before the manager closes.
        app.state.sweeps = Sweeps(jobs_manager, poll_seconds=min(0.5, settings.request_poll_seconds)).start()
        pool = app.state.inference
        app.state.judgements = Judgements(settings.data_dir() / JUDGEMENTS,
                                          lambda model_id, tokens, cancel: pool_answerer(pool, jobs_manager, model_id,
                                                                                         tokens, cancel=cancel))
        app.state.arena = Arena(settings.data_dir() / ARENA, settings.arena_exports(),
                                lambda model_id, p: pool_answerer(pool, jobs_manager, model_id, p.max_tokens,
                                                                  temperature=p.temperature, top_p=p.top_p),
                                lambda model_id: _unanswerable(jobs_manager, model_id))
        warmup = ChatWarmup(pool, jobs_manager, settings.request_poll_seconds).start() if settings.chat_warmup else None
        try:
            yield
        finally:
            if warmup is not None:
                warmup.close()
            app.state.arena.close()
            app.state.judgements.close()
            app.state.sweeps.close()
            app.state.inference.close()
            if own:
                app.state.manager.close()

    return lifespan


def _unanswerable(jobs: JobManager, model_id: str) -> str | None:
    """Why a chat model id cannot answer now (the arena's check), or None."""
    try:
        resolve(jobs, model_id)
    except UnknownModel as exc:
        return str(exc)
    return None


def _include_routers(app: FastAPI) -> None:
    """Every router behind the token, in this order; the health check open."""
    guarded = [Depends(require_token)]
    app.include_router(jobs.router, dependencies=guarded)
    app.include_router(logs.router, dependencies=guarded)
    app.include_router(downloads.router, dependencies=guarded)
    app.include_router(resources.router, dependencies=guarded)
    app.include_router(uploads.router, dependencies=guarded)
    app.include_router(models.router, dependencies=guarded)
    app.include_router(train.router, dependencies=guarded)
    app.include_router(system.router, dependencies=guarded)
    app.include_router(web.router, dependencies=guarded)
    app.include_router(datasets.router, dependencies=guarded)
    app.include_router(openai.router, dependencies=guarded)
    app.include_router(openai.status_router, dependencies=guarded)
    app.include_router(completions.router, dependencies=guarded)
    app.include_router(rewards.router, dependencies=guarded)
    app.include_router(audio.router, dependencies=guarded)
    app.include_router(benchmarks.router, dependencies=guarded)
    app.include_router(files.router, dependencies=guarded)
    app.include_router(fine_tuning.router, dependencies=guarded)
    app.include_router(sweeps.router, dependencies=guarded)
    app.include_router(judgements.router, dependencies=guarded)
    app.include_router(jobfile.router, dependencies=guarded)
    app.include_router(chat.router, dependencies=guarded)
    app.include_router(make_data.router, dependencies=guarded)
    app.include_router(arena.router, dependencies=guarded)
    app.include_router(system.health)


def _guard(app: FastAPI, settings: Settings) -> None:
    """The body limits and the request guard (Host, same origin, security headers); the last added is outermost."""
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, per_path={
        "/api/uploads": settings.max_upload_bytes, "/v1/files": settings.max_upload_bytes,
        # images travel in chat requests, as base64
        "/v1/chat/completions": settings.max_chat_body_bytes, "/api/chat/prompt": settings.max_chat_body_bytes,
        # a recording and its form fields: the file's own limit is checked by the route, in OpenAI's words
        "/v1/audio/transcriptions": settings.max_audio_bytes + 1024 * 1024})
    app.add_middleware(RequestGuard, settings=settings)  # added last: outermost, so it sees every request


def _mount_static(app: FastAPI) -> None:
    """The page and its charting library, where they are (mounted after the routers, so these answer first)."""
    if VENDOR.is_dir():
        app.mount("/vendor/uplot", StaticFiles(directory=VENDOR), name="vendor-uplot")
    if (STATIC / "index.html").is_file():
        app.mount("/", StaticFiles(directory=STATIC, html=True), name="web")
