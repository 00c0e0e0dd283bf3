"""Whether a model is still the one the fast decode step's C structs were made from.

``layer_step`` reads a model's weights, norms, rotary tables, KV pools and hooks once into C
structs and then runs whole decode steps from them. A learner may replace any of these between
steps (a module, a parameter, ``.data``, a hook, the KV cache), so before each step the watch
compares what is there now with what the structs were made from; any difference remakes them.
"""

from __future__ import annotations

import operator
import weakref

import torch
from torch.utils.hooks import RemovableHandle


class ModelWatch:
    """What a ``layer_step._Stack`` was made from, checked at each step in a few C-level passes (checking
    layer by layer in Python cost ~0.8 ms of a SmolLM2-135M step: run right after the previous
    step's weights went through the caches, each attribute look-up missed them): the modules
    and tensors at every place the structs were read from (replaced: another object there), the
    tensors' addresses (``.data`` replaced under the same object), the modules' classes, which of
    them have a forward hook (none of the layers'), the numbers of layers and pools, and the
    KV cache itself."""

    def __init__(self, model, kv_cache):
        self.places, self.keys, self.found, self.modules, self.tensors = [], [], [], [], []
        self._at(model._modules, "model")
        self._at(model.model._modules, "layers")
        layers = model.model.layers
        for i, layer in enumerate(layers):
            self._at(layers._modules, str(i))
            attn, mlp = layer._modules["self_attn"], layer._modules["mlp"]
            for owner, names in ((layer, ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")),
                                 (attn, ("qkv_proj", "o_proj")), (mlp, ("gate_up_proj", "down_proj"))):
                for name in names:
                    self._at(owner._modules, name)
            self.modules.append(layer)
            self._weights_of(self.found[-8:])
        self._ends(model)
        self._at(kv_cache.__dict__, "k")
        self._at(kv_cache.__dict__, "v")
        for pools in (kv_cache.k, kv_cache.v):
            for i in range(len(pools)):
                self._at(pools, i)
        self.tensors += [t for t in self.found if isinstance(t, torch.Tensor)]
        self.classes = list(map(type, self.modules))
        self.hooks = [d for m in self.modules for d in (m._forward_hooks, m._forward_pre_hooks)]
        self.hooked = list(map(bool, self.hooks))
        # handles made so far: with none of the modules hooked, no hook can have come since while no new one was
        # made (None: some were hooked, look every step)
        self.handles = None if any(self.hooked) else getattr(RemovableHandle, "next_id", None)
        self.addresses = list(map(torch.Tensor.data_ptr, self.tensors))
        self.counted = (layers._modules, kv_cache.k, kv_cache.v)
        self.sizes = list(map(len, self.counted))
        self.kv_cache = weakref.ref(kv_cache)

    def _at(self, place, key) -> None:
        self.places.append(place)
        self.keys.append(key)
        self.found.append(place[key])

    def _weights_of(self, modules) -> None:
        """Each module's parameters (and a streamed int8 projection's tensors)."""
        for module in modules:
            self.modules.append(module)
            for name in module._parameters:
                self._at(module._parameters, name)
            if getattr(module, "_stream", None) is not None:
                self._at(module.__dict__, "_stream")
                self.tensors += [t for t in module._stream if t is not None]

    def _ends(self, model) -> None:
        """The modules around the layers (``_ends``): rotary tables, lm head, embedding, final
        norm and its eps."""
        for owner, name in ((model, "rotary"), (model, "lm_head"), (model.model, "embed_tokens"),
                            (model.model, "norm")):
            self._at(owner._modules, name)
        rotary, lm_head, embed, norm = self.found[-4:]
        self._weights_of((rotary, lm_head, embed, norm))
        for name in ("cos", "sin"):
            if name in rotary._buffers:
                self._at(rotary._buffers, name)
        self._at(norm.__dict__, "eps")
        self._at(embed.__dict__, "max_norm")

    def _hooks_as_made(self) -> bool:
        """Whether each module has a forward hook as it had. A hook comes with a new ``RemovableHandle``
        (``register_forward_hook`` and the like), so while none was made since the last look, reading
        the 80 hook dicts of a 4-layer model (~4 us of the ~25 the watch takes in a step) is skipped."""
        made = getattr(RemovableHandle, "next_id", None)
        if made is not None and made == self.handles:
            return True
        if list(map(bool, self.hooks)) != self.hooked:
            return False
        if self.handles is not None:
            self.handles = made
        return True

    def holds(self, model, kv_cache) -> bool:
        try:
            return (self.kv_cache() is kv_cache
                    and all(map(operator.is_, map(operator.getitem, self.places, self.keys), self.found))
                    and list(map(len, self.counted)) == self.sizes and self._hooks_as_made()
                    and all(map(operator.is_, map(type, self.modules), self.classes))
                    and list(map(torch.Tensor.data_ptr, self.tensors)) == self.addresses)
        except (KeyError, IndexError, AttributeError):
            return False
