"""Pre-LN GPT-2 Studio: the Gradio app.

    python app.py [--model NAME_OR_PATH ...] [--device auto|cpu|cuda] [--quantize int8]
                  [--host H] [--port P] [--share] [--allow-load | --no-allow-load]

One tab per registered task (tasks.TASKS), built by ui.tab.task_tab from the task's view (ui/tabs/), plus
the architecture tab; a model panel on top. Each flag can also be set by an environment variable
(see `parse_args`), which is how a Hugging Face Space configures it.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import gradio as gr
from fastapi import APIRouter
from huggingface_hub.constants import HF_HUB_CACHE

from serve import QUANTIZATIONS, TASKS
from serve.admission import DEFAULT_CONCURRENCY, DEFAULT_QUEUE_SIZE
from serve.messages import Message, localized, render
from serve.backend import RemoteHost
from serve.host import Host
from serve.model_host import BUNDLED, LOAD_STEPS, ModelHost, ModelLoadError
from serve.openai_api import openai_routes
from serve.running import StopSwitches
from ui.accessibility import NAMED_PARTS_JS
from ui.api import api_endpoint, compare_endpoint, trace_endpoint
from ui.compare import model_choices
from ui.i18n import CHINESE, ENGLISH, i18n
from ui.messages import LANGUAGE_SWITCHED, PAGE_LANGUAGE_JS, Page, language, warn
from ui.presets import PRESETS_CSS, presets_store
from ui.tab import (GENERATION_EVENT, RUN_SHORTCUT_JS, TAB_CSS, Tab, TaskView, adapter_props, serves_bundled,
                    task_tab)
from ui.tabs.architecture import ARCHITECTURE_CSS, architecture_tab, lens_choices
from ui.tabs.chat import CHAT, CHAT_CSS, EDIT_KEYS_JS, KEEP_MESSAGE_BOX_IN_VIEW_JS
from ui.tabs.generate import GENERATE
from ui.tabs.summarise import SUMMARIZE
from ui.tabs.translate import TRANSLATE, TRANSLATE_CSS

PAGE_CSS = TAB_CSS + PRESETS_CSS + CHAT_CSS + TRANSLATE_CSS + ARCHITECTURE_CSS
PAGE_JS = (f"() => {{ ({RUN_SHORTCUT_JS})(); ({EDIT_KEYS_JS})(); ({KEEP_MESSAGE_BOX_IN_VIEW_JS})(); "
           f"({PAGE_LANGUAGE_JS})(); ({NAMED_PARTS_JS})(); }}")
VIEWS: dict[str, TaskView] = {view.task.name: view for view in (GENERATE, CHAT, TRANSLATE, SUMMARIZE)}

APP_DIR = Path(__file__).resolve().parent
MAX_UPLOAD = "1mb"


def build_app(host: Host) -> gr.Blocks:
    """The whole interface, serving the models of `host`, with its queue set up; start it with
    `launch`. Every generation, the page's and the APIs', takes its turn in the host's queue
    (serve/admission.py), not Gradio's."""
    stop_switches = StopSwitches()
    with gr.Blocks(title="Pre-LN GPT-2 Studio", delete_cache=(3600, 3600)) as demo:
        # Pressed by the page when its language is switched in Settings (ui/messages.py).
        page = Page(demo, gr.Button(visible="hidden", elem_id=LANGUAGE_SWITCHED))
        gr.Markdown(i18n("title"))
        gr.Markdown(i18n("subtitle"))
        model_info = gr.Markdown(host.current.describe(), elem_id="model-info")
        with gr.Accordion(i18n("model"), open=False):
            model_choice = gr.Dropdown(list(host.names), value=host.current.name, label=i18n("switch_model"),
                                       info=i18n(switch_model_info(host)), elem_id="model-choice")
            if host.allow_load:  # where anyone who reaches the page may fill the memory, not even shown
                model_to_load = gr.Textbox(label=i18n("load_model"), info=i18n("load_model_info"),
                                           elem_id="model-to-load")
                with gr.Row():
                    load_button = gr.Button(i18n("load_model_button"), variant="primary", elem_id="model-load")
                    unload_button = gr.Button(i18n("unload_model_button"), elem_id="model-unload")
        # Wrapped onto a second row rather than folded into an overflow menu: a phone sees every tab.
        # A view's state kept at the page's top level (Chat's conversations), and each tab's presets
        # kept in the browser: outside the tabs, whose only children must be tabs.
        page_states = {name: VIEWS[name].page_state() for name in TASKS if VIEWS[name].page_state}
        preset_stores = {name: presets_store(name) for name in TASKS}
        with gr.Tabs(overflow_behavior="wrap"):
            tabs = [task_tab(VIEWS[name], page, host, stop_switches, preset_stores[name], page_states.get(name))
                    for name in TASKS]
            lens_adapter, architecture_buttons = architecture_tab(page, host)

        for tab in tabs:
            gr.api(api_endpoint(tab.view.api, host), api_name=tab.view.api.name, **GENERATION_EVENT)
        gr.api(compare_endpoint(host), api_name="compare", **GENERATION_EVENT)  # two runs of any of them
        # A trace is seconds of the CPU's work: one at a time, beside the generations
        gr.api(trace_endpoint(host), api_name="trace", concurrency_limit=1, concurrency_id="trace")
        model_parts = ModelParts(model_info, model_choice, tabs, lens_adapter)
        # One change of the models at a time: a switch, a load or an unload.
        one_at_a_time = dict(concurrency_limit=1, concurrency_id="load_model", api_visibility="private",
                             show_progress_on=model_info)
        model_choice.select(changing_model(host, model_parts, lambda name, step: host.switch(name)), model_choice,
                            model_parts.outputs, api_name="load_model", **one_at_a_time)
        if host.allow_load:
            gr.on([load_button.click, model_to_load.submit], changing_model(host, model_parts, host.load),
                  model_to_load, model_parts.outputs, api_name="load_new_model", **one_at_a_time)
            unload_button.click(changing_model(host, model_parts, lambda name, step: host.unload(name)),
                                model_choice, model_parts.outputs, api_name="unload_model", **one_at_a_time)
        # A page opened after a switch shows the model being served, not the one at start-up.
        demo.load(show_model(host, model_parts, on_load=True), None, model_parts.outputs, queue=False,
                  api_visibility="private")
        # While the decode kernels build, the model line is refreshed until it says which path stays;
        # and written again in the language picked in Settings.
        refresh = gr.Timer(5, active=host.settling())
        for event in (refresh.tick, page.language_switched.click):
            event(refresh_model_line(host), None, [model_info, refresh], queue=False, api_visibility="private")
        tab_blocks = [block for block in demo.blocks.values() if isinstance(block, gr.Tab)]
        page.on_language(tab_names(tab_blocks), tab_blocks)
    # Every button each tab lays out, by the tab's elem_id: the page holds no other (tests/test_page.py).
    demo.buttons_by_tab = {**{f"tab-{tab.view.task.name}": [button.elem_id for button in tab.buttons] for tab in tabs},
                           "tab-architecture": [button.elem_id for button in architecture_buttons]}
    # Gradio starts a generation at once (GENERATION_EVENT) and the run waits for its turn in the
    # host's queue, in a thread of Gradio's: room for all of them (launch), beside the other events'.
    demo.max_threads = host.queue.threads
    # The page's other queued events (a trace, the live view, a model change) each name their
    # limit; they wait here, in Gradio's queue, as many as the host's queue holds.
    return demo.queue(default_concurrency_limit=host.queue.concurrency, max_size=host.queue.queue_size)


def launch(demo: gr.Blocks, models: Sequence[str] = (), routes: Sequence[APIRouter] = (), **options):
    """Start serving `demo` (options: those of gr.Blocks.launch), with the interface text in the
    browser's language, and `routes` on the same server and port (v1_routes: OpenAI's /v1 API).

    Gradio serves only the files the app hands out (its cache) and uploads, which no tab takes,
    so they are capped at 1 MB. The app's folder (code, bundled weights), the Hugging Face cache,
    the local directories among `models` (the names the app was started with) and whatever
    GRADIO_BLOCKED_PATHS names are blocked besides, which holds even where GRADIO_ALLOWED_PATHS
    or `allowed_paths` would open them. (Gradio reads GRADIO_BLOCKED_PATHS only when given no
    blocked paths of its caller, so it is added here.)
    """
    local = [Path(name).expanduser() for name in models]  # as model.checkpoint resolves a name
    blocked = [str(APP_DIR), HF_HUB_CACHE, *(str(path.resolve()) for path in local if path.is_dir()),
               *(path.strip() for path in os.environ.get("GRADIO_BLOCKED_PATHS", "").split(",") if path.strip())]
    blocking = not options.pop("prevent_thread_lock", False)
    quiet = options.pop("quiet", False)  # Gradio's own lines name its launch()'s arguments, not this app's flags
    served = demo.launch(i18n=i18n, css=PAGE_CSS, js=PAGE_JS, blocked_paths=blocked, max_file_size=MAX_UPLOAD,
                         max_threads=demo.max_threads, prevent_thread_lock=True, quiet=True, **options)
    if not quiet:
        print(f"* Running on local URL:  {served[1]}")
        if not demo.share and "SPACE_ID" not in os.environ:
            print("* To create a public link too, start the app with --share (or STUDIO_SHARE=1).")
    for router in routes:  # Gradio makes its FastAPI app as it launches: the routes join it then
        demo.app.include_router(router)
    if blocking:
        demo.block_thread()
    return served


def v1_routes(host: ModelHost, api_key: str | None = None) -> list[APIRouter]:
    """OpenAI's /v1 API for `host`'s models (serve/openai_api.py), its runs in the queue of the
    page's: with `api_key`, each request needs it."""
    return [openai_routes(host, api_key)]


@dataclass(frozen=True)
class ModelParts:
    """What on the page follows the model being served."""
    line: gr.Markdown
    choice: gr.Dropdown
    tabs: list[Tab]
    lens_adapter: gr.Dropdown

    @property
    def outputs(self) -> set:
        return {self.line, self.choice, self.lens_adapter, *(tab.adapter for tab in self.tabs),
                *(tab.insight.compare.model for tab in self.tabs), *self.bundled_notes,
                *(part for tab in self.tabs for part in tab.steer.follows_model)}

    @property
    def bundled_notes(self) -> list[gr.Markdown]:
        return [tab.bundled_note for tab in self.tabs if tab.bundled_note is not None]


def show_model(host: Host, parts: ModelParts, on_load: bool = False):
    """The page's parts for the model being served. On a page's load, a tab that keeps its adapter
    switch in the browser (Chat) keeps the value it restores: this load event and that one race."""
    def switch_state(tab: Tab, loaded) -> dict:
        props = adapter_props(tab.view.task, loaded)
        if on_load and tab.page_state is not None:
            props.pop("value")
        return gr.update(**props)

    def model_state(request: gr.Request) -> dict:
        loaded = host.current
        lang = language(request)
        return {parts.line: loaded.describe(lang), parts.choice: gr.update(choices=list(host.names), value=loaded.name),
                parts.lens_adapter: lens_choices(loaded, lang),
                **{tab.adapter: switch_state(tab, loaded) for tab in parts.tabs},
                **{tab.insight.compare.model: model_choices(host.names, loaded.name) for tab in parts.tabs},
                **{note: gr.update(visible=serves_bundled(loaded)) for note in parts.bundled_notes},
                **{part: update for tab in parts.tabs for part, update in tab.steer.for_model(loaded).items()}}
    return model_state


def tab_names(tab_blocks: list[gr.Tab]):
    """The tabs' names in the request's language: on a page switched to it in Settings (or opened
    in one kept from an earlier visit), Gradio translates a tab's name again only once the tab is
    opened."""
    def in_language(request: gr.Request) -> list[gr.Tab]:
        names = CHINESE if language(request) == "zh" else ENGLISH
        return [gr.Tab(label=names[tab.label.key]) for tab in tab_blocks]
    return in_language


def refresh_model_line(host: Host):
    def model_line(request: gr.Request):
        return host.current.describe(language(request)), gr.update(active=host.settling())
    return model_line


def switch_model_info(host: Host) -> str:
    """The model list's help: what it holds, or, with one model, how to have more."""
    if host.allow_load:
        return "switch_model_info_loadable"
    return "switch_model_info" if len(host.names) > 1 else "switch_model_info_one"


def changing_model(host: Host, parts: ModelParts, change: Callable[[str, Callable[[str], None]], object]):
    """A handler that makes `change` (switch, load or unload the model named, telling a load's steps
    to the progress bar on the model line), then shows the model served and the list."""
    model_state = show_model(host, parts)

    def change_model(name: str, request: gr.Request, progress=gr.Progress()):
        lang = language(request)

        def step(stage: str) -> None:
            said = render(Message.keyed(f"load_step_{stage}", name=name.strip()), lang)
            progress((LOAD_STEPS.index(stage), len(LOAD_STEPS)), desc=said)
        try:
            change(name, step)
        except ModelLoadError as error:  # and the model being served stays, as model_state shows
            warn(localized(error, lang), lang)
        return model_state(request)
    return change_model


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    on_space = "SPACE_ID" in env  # a Hugging Face Space must listen on every interface
    parser = argparse.ArgumentParser(
        description="Pre-LN GPT-2 Studio: try GPT-2 models on four tasks.",
        epilog="Offline: the bundled model and local directories need no network; a hub id loads from the "
               "local Hugging Face cache, and with HF_HUB_OFFLINE=1 the hub is never asked (without it, an "
               "unreachable hub is given up after a few seconds).")
    parser.add_argument("--model", action="append",
                        help="a hub id (gpt2), a local checkpoint directory, or 'bundled'; repeat it or give a "
                             "comma-separated list: the first is loaded, the others can be switched to in the "
                             f"model panel (env STUDIO_MODEL; default {BUNDLED})")
    parser.add_argument("--device", default=env.get("STUDIO_DEVICE", "auto"), choices=["auto", "cpu", "cuda"],
                        help="where the model runs (env STUDIO_DEVICE; default auto: cuda when available)")
    parser.add_argument("--quantize", default=env.get("STUDIO_QUANTIZE") or None, choices=list(QUANTIZATIONS),
                        help="store the weights as int8: less memory, faster decoding on a CPU "
                             "(env STUDIO_QUANTIZE; default off)")
    parser.add_argument("--host", default=env.get("STUDIO_HOST", "0.0.0.0" if on_space else "127.0.0.1"),
                        help="interface to listen on (env STUDIO_HOST; default 127.0.0.1, 0.0.0.0 on a Space)")
    parser.add_argument("--port", type=int, default=int(env.get("STUDIO_PORT") or env.get("GRADIO_SERVER_PORT") or 7860),
                        help="port (env STUDIO_PORT or GRADIO_SERVER_PORT; default 7860)")
    parser.add_argument("--share", action="store_true", default=env_flag("STUDIO_SHARE"),
                        help="also serve through a public gradio.live link (env STUDIO_SHARE=1)")
    parser.add_argument("--concurrency", type=int, default=int(env.get("STUDIO_CONCURRENCY", DEFAULT_CONCURRENCY)),
                        help=f"generations run at the same time, the page's and /v1's together "
                             f"(env STUDIO_CONCURRENCY; default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--queue-size", type=int, default=int(env.get("STUDIO_QUEUE_SIZE", DEFAULT_QUEUE_SIZE)),
                        help=f"requests that may wait for their turn, in the order they came, the page's and "
                             f"/v1's in one queue; more are turned away (env STUDIO_QUEUE_SIZE; "
                             f"default {DEFAULT_QUEUE_SIZE})")
    parser.add_argument("--backend", default=env.get("STUDIO_BACKEND") or None, metavar="URL",
                        help="send every tab's work to a deployment of replicas (python -m serve.cluster) at URL "
                             "rather than loading a model here; --model, --device and --quantize are then the "
                             "deployment's, and --concurrency bounds what this page sends it: raise it to 8 a "
                             "replica (env STUDIO_BACKEND)")
    parser.add_argument("--backend-key", default=env.get("STUDIO_BACKEND_KEY") or None, metavar="KEY",
                        help="the deployment's --api-key, sent with every request to --backend "
                             "(env STUDIO_BACKEND_KEY)")
    parser.add_argument("--allow-load", action=argparse.BooleanOptionalAction,
                        default=env_flag("STUDIO_ALLOW_LOAD") if "STUDIO_ALLOW_LOAD" in env else not on_space,
                        help="let the page load a hub id or a local directory, and unload a model; every visitor "
                             "could fill the memory (env STUDIO_ALLOW_LOAD=0/1; default on, off on a Space)")
    parser.add_argument("--api-key", default=env.get("STUDIO_API_KEY") or None,
                        help="require this key (Authorization: Bearer KEY) of every request to the OpenAI-compatible "
                             "/v1 API; the page and its Gradio API are unchanged (env STUDIO_API_KEY; default none)")
    args = parser.parse_args(argv)
    given = args.model or [env.get("STUDIO_MODEL") or BUNDLED]
    args.model = [name.strip() for names in given for name in names.split(",") if name.strip()] or [BUNDLED]
    return args


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        if args.backend:  # the deployment answers /v1 itself, at its own address
            host, routes = RemoteHost(args.backend, args.backend_key, args.concurrency, args.queue_size), []
        else:
            host = ModelHost(args.model, device=args.device, quantize=args.quantize, allow_load=args.allow_load,
                             concurrency=args.concurrency, queue_size=args.queue_size)
            routes = v1_routes(host, args.api_key)
    except ModelLoadError as error:
        sys.exit(f"app.py: {localized(error, 'en')}")
    demo = build_app(host)
    launch(demo, models=args.model, routes=routes, server_name=args.host, server_port=args.port, share=args.share)


if __name__ == "__main__":
    main()
