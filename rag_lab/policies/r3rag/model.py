"""R3-RAG's actor and critic as one module (so that one data-parallel wrapper holds both): the policy, a
causal LM, and a value head, a linear layer on a trunk's last hidden state.

- ``critic="shared"``: the value head reads the policy's own trunk (one forward gives the token log-probs and
  the values; the trunk learns from both losses).
- ``critic="separate"``: a copy of the initial model's trunk with its own head (the official code's critic
  model); the policy's weights see no value loss.

A step's value is read at its prompt's last token: the state the step was generated from (the step's own
tokens and the documents it retrieves come after it). Hand-written: TRL 1.16 has no value-head model any more.
"""

import copy
import json
from pathlib import Path

import torch
from torch import nn

CRITICS = ("shared", "separate")


class ActorCritic(nn.Module):
    def __init__(self, lm: nn.Module, critic: str = "shared", critic_lm: nn.Module | None = None):
        """``critic_lm``: the separate critic's trunk (null: a copy of ``lm``, the initial model's)."""
        super().__init__()
        if critic not in CRITICS:
            raise ValueError(f"critic must be one of {', '.join(CRITICS)}, got {critic!r}")
        self.lm = lm
        self.critic = critic
        separate = critic == "separate"
        self.critic_lm = (critic_lm or copy.deepcopy(lm)) if separate else None
        self.head = nn.Linear(lm.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.head.to(next(lm.parameters()).device)
        # FSDP's transformer-based wrap shards each of the LM's layers on its own (accelerate reads this)
        self._no_split_modules = list(getattr(lm, "_no_split_modules", None) or [])

    @property
    def is_gradient_checkpointing(self) -> bool:
        """Whether the trunks recompute their activations in the backward pass (TRL's
        ``unwrap_model_for_generation`` asks, to turn it off while generating and on again after)."""
        return any(lm.is_gradient_checkpointing for lm in self.trunks())

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """transformers' gradient checkpointing in both trunks (the policy's and a separate critic's).
        transformers checkpoints in train mode only: PPO then trains with every dropout off
        (:func:`no_dropout`), so that a train-mode forward is the eval-mode one."""
        for lm in self.trunks():
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self) -> None:
        for lm in self.trunks():
            lm.gradient_checkpointing_disable()

    def trunks(self) -> list[nn.Module]:
        return [lm for lm in (self.lm, self.critic_lm) if lm is not None]

    def tie_weights(self) -> None:
        """Each LM's input and output embeddings tied again (what accelerate's FSDP2 preparation calls on the
        model it prepares after RAM-efficient loading, whose broadcast assigns each weight anew: untied, the
        output embedding would be a second weight that no optimizer steps)."""
        for lm in self.trunks():
            if hasattr(lm, "tie_weights"):
                lm.tie_weights()

    def actor_parameters(self) -> list[nn.Parameter]:
        return list(self.lm.parameters())

    def critic_parameters(self) -> list[nn.Parameter]:
        trunk = list(self.critic_lm.parameters()) if self.critic_lm is not None else []
        return trunk + list(self.head.parameters())

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        value_at: torch.Tensor | None = None,
        **lm_kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the log-prob of each next token [N, L-1], the value at position ``value_at`` of each row [N]).
        Without ``value_at``: the LM's own output for these arguments. Generation on a sharded actor-critic
        runs through here, so that the hooks FSDP put on this module gather the LM's weights it holds
        (:mod:`rag_lab.train.lockstep`)."""
        if value_at is None:
            return self.lm(input_ids=input_ids, attention_mask=attention_mask, **lm_kwargs)
        out = self.lm(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=self.critic_lm is None
        )
        logprobs = token_logprobs(out.logits, input_ids)
        if self.critic_lm is None:
            hidden = out.hidden_states[-1]
        else:
            hidden = self.critic_lm(
                input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True
            ).hidden_states[-1]
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        values = self.head(hidden[rows, value_at].float()).squeeze(-1)
        return logprobs, values

    def save(self, path: Path) -> None:
        """The policy as a transformers model in ``path`` (what the runner loads), the critic beside it."""
        path.mkdir(parents=True, exist_ok=True)
        self.lm.save_pretrained(path)
        torch.save(self.head.state_dict(), path / "value_head.pt")
        if self.critic_lm is not None:
            self.critic_lm.save_pretrained(path / "critic")
        (path / "critic.json").write_text(json.dumps({"critic": self.critic}) + "\n")

    def load_critic(self, path: Path) -> None:
        """The value head (and separate critic) saved by :meth:`save` in ``path``."""
        self.head.load_state_dict(torch.load(path / "value_head.pt", map_location="cpu"))
        if self.critic_lm is not None:
            from rag_lab.train.resume import load_model

            self.critic_lm.load_state_dict(load_model(path / "critic", like=self.critic_lm).state_dict())


def no_dropout(model: nn.Module) -> nn.Module:
    """``model`` with every dropout at 0 (TRL's ``disable_dropout_in_model``) and its attention layers'
    ``attention_dropout`` too (transformers' attention applies it in train mode), so that it computes in train
    mode what it computes in eval mode: PPO's first ratio stays exactly 1 with gradient checkpointing on."""
    from trl.trainer.utils import disable_dropout_in_model

    disable_dropout_in_model(model)
    for module in model.modules():
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    return model


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log π(x_{j+1} | x_≤j) for j = 0 … L-2, [N, L-1], in float32."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
