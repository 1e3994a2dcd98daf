"""What `lightning-rl serve` is started with: `ServeConfig` (where it listens, its keys, its models, its sampler) and
`ServeLimits` (what one request, one client and one key may take)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_rl.core.contracts import Rollout

DEFAULT_PORT = 8000


@dataclass(frozen=True)
class ServeLimits:
    """Bounds on what a client may send or hold: a request past one is refused (413 for a body, 400 for a field, 429
    for a full queue) before it costs memory or time."""

    max_request_mb: float = 64.0
    """Largest request body, in MiB, after decompression (413 above it)."""
    max_datums: int = 4096
    """Sequences in one forward_backward request."""
    max_tokens_per_request: int = 1_048_576
    """Tokens in one forward_backward request, all its sequences together."""
    max_num_samples: int = 256
    """``num_samples`` of one sample request."""
    max_queued_per_client: int = 1024
    """Requests waiting in one training client's or sampler's queue (429 past it; the SDK retries)."""
    max_sessions_per_key: int = 64
    """Live sessions of one API key."""
    max_models_per_key: int = 16
    """Live training clients of one API key (each holds adapters, gradients and optimizer state)."""
    max_snapshots_per_key: int = 64
    """Sampler weights held in memory per API key; the oldest unnamed one is dropped first."""
    body_timeout_s: float = 60.0
    """A request whose body has not all arrived this long after its head is answered 408."""
    idle_timeout_s: float = 75.0
    """A connection that sends no complete request head for this long is closed."""

    def __post_init__(self):
        sizes = (self.max_datums, self.max_tokens_per_request, self.max_num_samples, self.max_queued_per_client)
        if self.max_request_mb <= 0 or min(sizes) < 1 or self.body_timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ValueError(f"serve.limits: sizes, counts and timeouts must be > 0, got {self}")


@dataclass
class ServeConfig:
    """`lightning-rl serve`: the Tinker API on this machine, training LoRA adapters (or full models) of local base
    models and sampling from them."""

    base_models: list[str] | str = field(default_factory=list)
    """Local model folders (``save_pretrained`` output) clients may train and sample; each loaded once at start and
    shared by every client. Clients name one by its absolute path, the path as given here, or its folder's name."""
    api_keys: list[str] | str = field(default_factory=list)
    """Keys a client must send (``TINKER_API_KEY``), each starting with ``tml-``. Each key is a tenant: its sessions,
    models, samplers and checkpoints are invisible to the others. Empty: one key is made and printed at start.
    ``LIGHTNING_RL_SERVE_API_KEYS`` (comma-separated) adds keys without putting them on the command line."""
    host: str = "127.0.0.1"
    """Address to listen on: loopback unless told otherwise (every request must still carry a key)."""
    port: int = DEFAULT_PORT
    """Port to listen on (0: one the OS picks, printed at start)."""
    checkpoint_dir: str = "runs/serve"
    """Where save_state / save_weights_for_sampler write (tinker:// paths map below it, per key)."""
    sampler: Rollout | None = None
    """Where sampling clients sample: None samples in this process (``HFRollout`` on the service's own copy of the
    weights); a `VLLMRollout` or `SGLangRollout` samples on that server, each sampler's weights pushed (and verified)
    before its first sample. A server serves one base model: give one ``base_models`` entry with it."""
    lora_alpha: float = 32.0
    """LoRA's alpha: adapters scale their update by alpha / rank (the SDK sets the rank, not alpha)."""
    default_max_tokens: int = 64
    """New tokens a sample request may take when its sampling_params give no max_tokens."""
    threads: int | None = None
    """torch's intra-op threads for the service's forward passes (None: torch's default). A small model on a busy
    machine runs many times faster on 1 (threads that wait on each other for cores cost more than they compute)."""
    micro_batch_tokens: int = 16384
    """Padded tokens per forward pass; a forward_backward of more runs in micro-batches (same gradient)."""
    session_timeout_s: float = 120.0
    """A session whose client sent no heartbeat (every 10 s) for this long ends: its queued requests fail and its
    models, samplers and results are dropped (saved checkpoints stay)."""
    seq_gap_s: float = 5.0
    """A training client's requests run in the order the SDK numbers them. A request refused before its number was
    read (a body too large) leaves a gap: the requests after it run once they have waited this long for it."""
    future_ttl_s: float = 900.0
    """How long a finished request's result waits to be retrieved."""
    long_poll_s: float = 20.0
    """How long ``retrieve_future`` waits for a result before answering "try again" (the SDK waits 45 s)."""
    limits: ServeLimits = field(default_factory=ServeLimits)

    def __post_init__(self):
        # one folder or key given alone (``--base_models path``) is a list of one
        if isinstance(self.base_models, str):
            self.base_models = [self.base_models]
        if isinstance(self.api_keys, str):
            self.api_keys = [self.api_keys]
