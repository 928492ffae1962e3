"""What every trainer's settings meet, checked before anything trains: the batch and the ranks (issue 66).

A setting's own range is declared with it (:mod:`rag_lab.core.ranges`); what a declaration cannot say is a
relation: between two settings of one trainer (a micro-batch and the step it splits), or between a setting
and the processes a launched run splits it over (``launch.config.num_processes``, 1 without ``launch``:
:func:`processes_of`). Each rule below is a function of the settings and that count; each trainer's
``check_settings`` calls the rules it needs (:mod:`rag_lab.core.config` calls it at compose with the whole
config, nested settings nodes included), ``Launch.check_settings`` calls :func:`divides`, and the runner
checks the LoRA modules against the model before the run dir is touched (:func:`lora_targets`). A
violation is one ``RagLabError`` line naming the keys and their values.

=====================================================  ==========================================  ========
rule                                                   settings                                    where
=====================================================  ==========================================  ========
each process an equal share of every global batch      DAPO ``questions_per_step``, APEX           divides
                                                       ``planner.questions_per_step`` and
                                                       ``executor.batch_size``, EVO-RAG's DPO
                                                       ``batch_size``, Stop-RAG's Q-net
                                                       ``batch_size``, R3-RAG ``ppo.batch_size``,
                                                       ``cold_start.batch_size``
a held-out question for every process                  ``heldout.n`` >= processes (or 0)           divides
a micro-batch divides each process's share of a step   DAPO ``micro_batch``, APEX                  new
                                                       ``planner.micro_batch`` vs
                                                       ``questions_per_step x group_size / P``
TRL's generation batch holds whole groups              ``num_generations`` (``group_size``)        implied
                                                       divides ``questions_per_step x group_size``
every PPO minibatch has a sample in each process       ``ppo.minibatches`` <= ``ppo.batch_size /   new
                                                       P x len(ppo.temperatures)``
a GRPO step finds its questions                        ``train_limit`` >= ``questions_per_step``   new
                                                       (DAPO; APEX's planner)
LoRA adapters sit on modules of the model              ``lora.r`` > 0 needs ``target_modules``,    new
                                                       each a module of the run's model; a
                                                       ``lora`` node given as a plain mapping is
                                                       checked against its ranges too
a colocated vLLM engine's tensor-parallel group        ``generator.tensor_parallel_size`` divides  new
splits the ranks (TRL's colocate mode)                 P where the policy trains
=====================================================  ==========================================  ========

"implied": TRL requires its generation batch (``per_device_train_batch_size x processes x
steps_per_generation``) to be divisible by ``num_generations``; :func:`rag_lab.train.grpo.passes` makes it
``questions_per_step x group_size`` by construction once the rows above hold. Not a rule: R3-RAG's
``ppo.micro_batch`` need not divide a minibatch (a minibatch's samples vary; it is cut in pieces of at most
that many), and EVO-RAG's ``grad_accum`` multiplies its DPO batch (any value fits).

Hand-written: only these relations, each read from the library that imposes it (TRL's ``RepeatSampler``
drops a generation batch it cannot fill; its ``GRPOConfig`` and colocate mode check the two last rows
at start-up, after the models have loaded; PEFT's ``LoraConfig`` matches module names by suffix).
"""

from collections.abc import Mapping


def processes_of(run) -> int:
    """The processes the run's training takes (``launch.config.num_processes``); 1 without ``launch`` (or
    outside a composed config: ``run`` None)."""
    launch = run.get("launch") if run is not None else None
    n = (launch.get("config") or {}).get("num_processes", 1) if launch else 1
    return n if isinstance(n, int) and n >= 1 else 1


def micro_batch(s: Mapping, unit: str, processes: int = 1) -> list[tuple[str, str]]:
    """``micro_batch`` divides each process's share of a step (``questions_per_step x group_size`` ``unit``
    over ``processes``; a larger one is one pass): :func:`rag_lab.train.grpo.passes` at training time."""
    micro, questions, group = s.get("micro_batch"), s["questions_per_step"], s["group_size"]
    if not micro or questions % processes:  # no micro-batch; an unequal share is divides' line
        return []
    share = questions * group // processes
    if micro < share and share % micro:
        each = f" / {processes} processes" if processes > 1 else ""
        why = (
            f"{micro} does not divide each process's {share} {unit} of a step (questions_per_step "
            f"{questions} x group_size {group}{each})"
        )
        return [("micro_batch", why)]
    return []


def enough_questions(s: Mapping) -> list[tuple[str, str]]:
    """A GRPO step's questions exist: TRL's ``RepeatSampler`` drops a generation batch it cannot fill, so
    fewer training questions than ``questions_per_step`` train no step."""
    limit, questions = s.get("train_limit"), s["questions_per_step"]
    if limit and limit < questions:
        why = f"{limit} training questions fill no step of questions_per_step={questions}"
        return [("train_limit", why)]
    return []


def ppo_minibatches(ppo: Mapping, processes: int = 1) -> list[tuple[str, str]]:
    """Every PPO minibatch has a sample in each process: an iteration has at least one sample (step) per
    episode, ``batch_size / processes x len(temperatures)`` episodes a process; a minibatch empty everywhere
    is an optimizer step of zero gradient, which Adam's momentum still moves."""
    batch, temperatures, minibatches = ppo["batch_size"], len(list(ppo["temperatures"])), ppo["minibatches"]
    if batch % processes or not temperatures:  # divides' line; the temperatures' own
        return []
    fewest = batch // processes * temperatures
    if minibatches <= fewest:
        return []
    each = f" / {processes} processes" if processes > 1 else ""
    why = (
        f"{minibatches} minibatches and as few as {fewest} samples an iteration in each process "
        f"(ppo.batch_size {batch}{each} x {temperatures} temperatures): at most {fewest}"
    )
    return [("minibatches", why)]


def colocated_engine(s: Mapping, run) -> list[tuple[str, str]]:
    """A colocated vLLM engine (``generator=vllm``, ``train_mode`` colocate) of a run whose policy trains:
    TRL groups the ranks ``tensor_parallel_size`` at a time, so that size divides the processes."""
    from rag_lab.core.config import locate

    policy = run.get("policy") if run is not None else None
    trains = bool(policy) and getattr(locate(policy["_target_"]), "trains", False)
    tp, n = s.get("tensor_parallel_size", 1), processes_of(run)
    if trains and s.get("train_mode") == "colocate" and n % tp:
        why = (
            f"{tp} does not divide the {n} training process(es) (launch.config.num_processes): TRL's "
            "colocated engine takes the ranks tensor_parallel_size at a time"
        )
        return [("tensor_parallel_size", why)]
    return []


def divides(processes: int, run) -> list[tuple[str, str]]:
    """Every global batch of the run's policy (its class names them: ``global_batches(settings) -> {key:
    size}``; so does a stopping rule it trains), the cold start's included, splits into equal shares, one
    per process, so N processes make the update of one; and a held-out curve has a question for every
    process (:func:`rag_lab.train.heldout.measured`)."""
    sizes = {}
    for where, cls, node in trainers(run):
        batches = getattr(cls, "global_batches", None)
        sizes |= {
            f"{where}.{key}".removeprefix("policy."): n
            for key, n in (batches(node) if batches else {}).items()
        }
    settings = trainers(run)[0][2]
    if isinstance(settings.get("cold_start"), dict) and settings["cold_start"].get("batch_size"):
        sizes["cold_start.batch_size"] = int(settings["cold_start"]["batch_size"])
    problems = []
    for key, size in sizes.items():
        if size % processes:
            why = f"{processes} processes do not divide policy.{key}={size} (each takes an equal share)"
            problems.append(("config.num_processes", why))
    for where, _, node in trainers(run):  # each process measures a share of a held-out curve's questions
        held = node.get("heldout")
        n = held.get("n") if isinstance(held, dict) else getattr(held, "n", None)
        if n and n < processes:
            why = (
                f"{processes} processes and {where}.heldout.n={n} held-out questions: at least one a process"
            )
            problems.append(("config.num_processes", why))
    return problems


def trainers(run) -> list[tuple[str, type, dict]]:
    """(where, class, settings) of the run's policy and of a stopping rule it trains."""
    from omegaconf import OmegaConf

    from rag_lab.core.config import locate, schema_for

    def with_defaults(target: str, node: dict) -> dict:  # the node over its signature's defaults
        schema = schema_for(target)
        return (OmegaConf.to_container(OmegaConf.structured(schema)) if schema is not dict else {}) | node

    settings = with_defaults(run.policy._target_, OmegaConf.to_container(run.policy, resolve=True))
    parts = [("policy", locate(run.policy._target_), settings)]
    stopper = settings.get("stopper")
    if isinstance(stopper, dict) and stopper.get("_target_"):
        parts.append(
            ("policy.stopper", locate(stopper["_target_"]), with_defaults(stopper["_target_"], stopper))
        )
    return parts
