"""Named windows: module-like records for work a model does in plain functions, which no module hook
sees (collectors/modules.py tracks modules only).

The output-logits matmul is the largest of a GPT, and the two Megatron-DeepSpeed paths to it are
functions: `parallel_lm_logits` (megatron/model/language_model.py; GPTModel's forward calls it), and
under DeepSpeed's PipelineModule a `TiedLayerSpec`'s `forward_fn(tied_module, x)` (GPTModelPipe's
`_logits_helper`, which calls `parallel_lm_logits`). Without a window their FLOPs and time were in
no record: a parent's FLOPs were not its children's plus its own ops, and the biggest matmul was
lost. A window opens and closes like a module's forward on tracked steps (backward too: entered
when the gradient reaches its output, left when it reaches its input), so the layers collector
gives it time and FLOPs and collectives inside it carry its name. It is named as a child of the
module it runs in: `<module>.<function>`, or `<function>` inside a root named by its class
(`module.parallel_lm_logits` under a DeepSpeed engine, `module._logits_helper` in a PipelineModule
that its PipelineEngine calls as `module`, `module._logits_helper.parallel_lm_logits` within it).

What is wrapped: `parallel_lm_logits` wherever a loaded `megatron` module holds it (the defining
module and those that imported it by name), patched when Megatron is imported (at install or a
later step boundary); a PipelineModule's tied `forward_fn` entries in its `forward_funcs` list, when
the tracker first names the module tree that holds it. Untracked steps pay one test per call.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from diag.agent.api import AgentAPI
from diag.agent.undo import Undo

FUNCTIONS = ("parallel_lm_logits",)  # plain functions of the Megatron family that do a model's work
FRAMEWORK = "megatron"
PIPE_MODULE = "deepspeed.runtime.pipe.module"


class Windows:
    """Wraps the known functions for a tracker (`begin(name, leaf, args)`, `end(name, args, out)`,
    its `stack`, the names of its `roots`)."""

    def __init__(self, tracker: Any, agent: AgentAPI, undo: Undo) -> None:
        self.tracker, self.undo = tracker, undo
        self.begin = agent.guard("modules", tracker.begin, "window-begin")
        self.end = agent.guard("modules", tracker.end, "window-end")
        self.wrappers: dict[int, Callable[..., Any]] = {}  # id(original function) -> its window
        self.ours: set[int] = set()  # ids of the windows themselves (never wrapped again)
        self.modules_seen = -1  # len(sys.modules) at the last scan

    def wrap(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        """`fn` inside a window named after `label` (the stack's top is its parent)."""
        stack, roots, begin, end = self.tracker.stack, self.tracker.roots, self.begin, self.end

        @functools.wraps(fn)
        def window(*args: Any, **kwargs: Any) -> Any:
            if not stack:  # an untracked step, or outside any module: no window
                return fn(*args, **kwargs)
            top = stack[-1]
            name = label if top in roots else f"{top}.{label}"
            begin(name, False, args)
            try:
                out = fn(*args, **kwargs)
            except BaseException:
                end(name, args, None, True)
                raise
            end(name, args, out)
            return out

        self.ours.add(id(window))
        return window

    def scan(self) -> None:
        """Wrap the known functions of the Megatron modules loaded since the last scan."""
        count = len(sys.modules)
        if count == self.modules_seen:
            return
        self.modules_seen = count
        for mod_name, mod in list(sys.modules.items()):
            if not mod_name.startswith(FRAMEWORK) or mod is None:
                continue
            namespace = getattr(mod, "__dict__", {})
            for fname in FUNCTIONS:
                fn = namespace.get(fname)
                if not callable(fn) or id(fn) in self.ours:
                    continue
                window = self.wrappers.get(id(fn))
                if window is None:
                    window = self.wrappers[id(fn)] = self.wrap(fn, fname)
                self.undo.patch(mod, fname, window)

    def pipeline(self, root: Any) -> None:
        """Windows around the tied `forward_fn`s of each DeepSpeed PipelineModule in `root`'s tree."""
        cls = getattr(sys.modules.get(PIPE_MODULE), "PipelineModule", None)
        if cls is None:
            return
        for mod in root.modules():
            if isinstance(mod, cls):
                self._tied(mod)

    def _tied(self, pipe: Any) -> None:
        funcs = getattr(pipe, "forward_funcs", None)
        tied = {id(m): key for key, m in getattr(pipe, "tied_modules", {}).items()}
        if not isinstance(funcs, list):
            return
        for i, fn in enumerate(funcs):
            if isinstance(fn, functools.partial) and fn.args and id(fn.args[0]) in tied:
                name = getattr(fn.func, "__name__", "")
                label = name if name.isidentifier() else f"{tied[id(fn.args[0])]}_forward_fn"
                funcs[i] = self.wrap(fn, label)
                self.undo.call(functools.partial(_put_back, funcs, i, funcs[i], fn), "windows.forward_fn")


def _put_back(funcs: list[Any], i: int, window: Any, original: Any) -> None:
    if i < len(funcs) and funcs[i] is window:
        funcs[i] = original
