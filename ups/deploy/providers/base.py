"""The provider interface: what a managed run asks of a provider that rents machines.

Everything that crosses from a provider into the core is typed here (STYLE §17-18): an
:class:`Offer` and an :class:`Instance` (with an :class:`InstanceState`), both carrying
the provider's own fields opaque in ``data`` (dstack's ``backend_data``: only the
provider reads them); the :class:`OfferRequirements` a user states once, which each
provider translates to its own search; the :class:`CreateRequest` a supervisor sends
(the run id and its lease epoch ride in the instance's label); the :class:`Capabilities`
a provider declares, which the managed run asks instead of the provider's name; the
:class:`Backoff` it declares for its API; and the :class:`Account` whose words every
API error is explained with, so "key rejected" reads the same on every provider.

A provider is one package under ``ups/deploy/providers/<name>/`` that satisfies
:class:`ProviderPackage` (its hosts.yaml model, ``open_provider``, ``on_instance``) plus
one line in the registry (:mod:`ups.deploy.providers`). The :class:`RecoveryPolicy` is
the one object that decides where a run goes when an offer, a host or an instance fails
it (the next offer, the next provider, wait and retry).

The contract is the docstrings of this module. Ids are strings on every provider; money
is dollars per hour for the whole instance; times are seconds.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ups.backoff import Policy
from ups.deploy.entries import RentedHost
from ups.deploy.errors import DeployError
from ups.deploy.frontend import command

# -- how a provider fails ---------------------------------------------------------------

EXIT_PROVIDER_API = 5
"""The provider's API refused or could not answer (no key, key rejected, rate limited, bad
query)."""
EXIT_NO_OFFER = 6
"""No offer matched the requirements under the price cap; nothing was created."""


class ApiErrorKind(enum.Enum):
    """What went wrong with a call to a provider's API, whatever its words or status.

    A provider classifies by what the API *says* (the body's error code), not by the HTTP
    status alone: Vast answers a wrong key with 404 ``auth_error`` on some endpoints.
    """

    KEY_MISSING = "key_missing"
    """No API key was found where the provider's SDK looks for one."""
    KEY_REJECTED = "key_rejected"
    """The key is wrong, revoked, or may not do this."""
    RATE_LIMITED = "rate_limited"
    """Still rate limited after the provider's retries."""
    SERVER_ERROR = "server_error"
    """The provider's side failed (5xx) after the retries."""
    BAD_REQUEST = "bad_request"
    """The request (most often the user's own offer query) was refused as malformed."""
    OFFER_TAKEN = "offer_taken"
    """Someone else rented the offer between the search and the create."""
    NOT_FOUND = "not_found"
    """The thing asked about does not exist (an instance already gone)."""
    UNREACHABLE = "unreachable"
    """No answer at all (network, DNS, a wrong API URL) after the retries."""
    OTHER = "other"


class ProviderApiError(DeployError):
    """A call to a provider's API failed; its message is one paragraph with the fix
    (:func:`api_error` words it the same on every provider)."""

    exit_code = EXIT_PROVIDER_API

    def __init__(
        self, message: str, status: int | None = None, kind: ApiErrorKind = ApiErrorKind.OTHER
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class NoOffer(DeployError):
    """No offer matches under the cap (or every match was excluded): nothing was created."""

    exit_code = EXIT_NO_OFFER


class OfferTaken(ProviderApiError):
    """The offer was rented by someone else between search and create: take the next one.

    Only when every offer tried was taken does it end the deploy, with exit 6 (no offer)."""

    exit_code = EXIT_NO_OFFER


@dataclass(frozen=True)
class Account:
    """Where a provider's API key lives and how to replace it: the words of every error.

    Each field is what a person needs to fix a key problem on this provider; :func:`api_error`
    puts them into the same sentences for every provider.
    """

    title: str
    """The provider as people write it: ``Vast``, ``RunPod``."""
    key_locations: str
    """Where the key is read, in the order tried (``VAST_API_KEY, ~/.config/vastai/...``)."""
    key_page: str
    """Where a new key is made (a URL)."""
    save_key: str
    """How to save a new key so ups finds it (a command)."""
    console: str
    """Where a person sees and ends the account's instances by hand (a URL)."""
    status_page: str | None = None
    """The provider's status page, for server errors."""
    query_help: str = ""
    """How to check the provider's own offer query (``offer:`` in hosts.yaml)."""
    retry_env: str = ""
    """The environment variable that sets how long rate limits are retried."""
    endpoint_option: str = ""
    """The hosts.yaml option that points ups at another API URL (a fake in tests)."""


def api_error(
    account: Account,
    kind: ApiErrorKind,
    what: str,
    *,
    status: int | None = None,
    detail: str = "",
    retried_s: float = 0.0,
) -> ProviderApiError:
    """The one paragraph for a failed API call of kind ``kind`` while trying to ``what``,
    with the fix, in the same words on every provider (only ``account`` differs)."""
    http = f"HTTP {status}" if status is not None else "no HTTP status"
    said = f": {detail}" if detail else ""
    title = account.title
    if kind is ApiErrorKind.KEY_MISSING:
        text = (
            f"no {title} API key found (looked in {account.key_locations}). Make one at "
            f"{account.key_page} and save it with `{account.save_key}`. ups never takes the "
            "key on its command line."
        )
    elif kind is ApiErrorKind.KEY_REJECTED:
        text = (
            f"the {title} API rejected the API key ({http}) when trying to {what}{said}. The "
            f"key read from {account.key_locations} is wrong, revoked or lacks the permission; "
            f"make a new one at {account.key_page} and save it with `{account.save_key}`."
        )
    elif kind is ApiErrorKind.OFFER_TAKEN:
        return OfferTaken(
            f"the offer was taken before ups could rent it ({http} when trying to {what})"
            f"{said}. Someone else rented it between the search and the create; ups moves on "
            "to the next matching offer.",
            status,
            kind,
        )
    elif kind is ApiErrorKind.RATE_LIMITED:
        raise_it = f" (or raise {account.retry_env})" if account.retry_env else ""
        text = (
            f"the {title} API kept rate-limiting us ({http}) for {retried_s:.0f} s while "
            f"trying to {what}{said}. Wait a minute and run the command again{raise_it}."
        )
    elif kind is ApiErrorKind.SERVER_ERROR:
        status_page = f" (see {account.status_page})" if account.status_page else ""
        text = (
            f"the {title} API failed to {what} ({http}, a server error){said}. This is "
            f"{title}'s side, not your request: wait a few minutes{status_page} and run the "
            f"command again; {command('instances')} shows whether anything was left running."
        )
    elif kind is ApiErrorKind.BAD_REQUEST:
        text = f"the {title} API rejected the request to {what} ({http}){said}. " + (
            account.query_help or "Check the rented entry in hosts.yaml."
        )
    elif kind is ApiErrorKind.UNREACHABLE:
        where = (
            f" (or `{account.endpoint_option}` in hosts.yaml)" if account.endpoint_option else ""
        )
        text = (
            f"cannot reach the {title} API to {what} after {retried_s:.0f} s of retries"
            f"{said}. Check the network{where} and run the command again."
        )
    else:
        text = f"the {title} API failed to {what} ({http}){said}."
    return ProviderApiError(text, status, kind)


class Side(enum.Enum):
    """Whose fault a failure on a rented machine is."""

    HOST = "host"
    """Another machine would not repeat it: destroy, record the machine, next offer."""
    USER = "user"
    """Every machine would repeat it: stop, and burn no further offer."""


@dataclass(frozen=True)
class Fault:
    """Why an instance will never run, as its provider reads its status."""

    side: Side
    meaning: str
    """In a few words (``the machine's NVIDIA driver or container runtime is broken``)."""


# -- labels: which run, which supervisor ------------------------------------------------

LABEL_PREFIX = "ups:"


@dataclass(frozen=True)
class RunLabel:
    """What an instance's label (or name) says about it: ``ups:<host>:<run_id>@<epoch>``.

    ``host`` is the hosts.yaml entry that rented it, ``epoch`` the lease epoch of the
    supervisor that created it (:mod:`ups.deploy.managed.lease`): a supervisor holding a
    newer epoch ends any instance of its run from an older one that it did not create or
    adopt. Labels of the previous release have no epoch (None: older than any).
    """

    host: str
    run_id: str
    epoch: int | None = None

    def __str__(self) -> str:
        tail = "" if self.epoch is None else f"@{self.epoch}"
        return f"{LABEL_PREFIX}{self.host}:{self.run_id}{tail}"

    def older_than(self, epoch: int) -> bool:
        return self.epoch is None or self.epoch < epoch


def label_for(host: str, run_id: str, epoch: int | None = None) -> str:
    """The label ups gives an instance: the entry, the run it serves, the creator's epoch."""
    return str(RunLabel(host, run_id, epoch))


def parse_label(label: str | None) -> RunLabel | None:
    """What a ups label says, or None for an instance ups did not create."""
    if not label or not label.startswith(LABEL_PREFIX):
        return None
    host, _, rest = label[len(LABEL_PREFIX) :].partition(":")
    run_id, at, epoch = rest.partition("@")  # '@' is never in a run id (ups.runid)
    if not run_id or (at and not epoch.isdigit()):
        return None
    return RunLabel(host, run_id, int(epoch) if at else None)


# -- offers -----------------------------------------------------------------------------

_VENDOR_WORDS = re.compile(r"nvidia|geforce|amd|radeon|tesla|[\s_\-]+", re.IGNORECASE)


def gpu_key(name: str) -> str:
    """A GPU model name without case, spaces, ``_``/``-`` or vendor words: ``RTX_4090``,
    ``NVIDIA GeForce RTX 4090`` and ``rtx 4090`` are all ``rtx4090``."""
    return _VENDOR_WORDS.sub("", name).lower()


def gpu_matches(wanted: str, offered: str) -> bool:
    """Whether an offer's GPU model ``offered`` is the model ``wanted`` (``A100`` matches
    ``A100 80GB PCIe`` and ``A100-SXM4-80GB``: the offered name starts with the wanted one)."""
    return gpu_key(offered).startswith(gpu_key(wanted))


@dataclass(frozen=True)
class Offer:
    """One machine (or a share of one) a provider offers to rent, typed.

    Prices are dollars per hour for the whole instance, the requested disk included.
    """

    id: str
    """The provider's id for the offer (what :meth:`Provider.create` rents)."""
    provider: str
    gpu_name: str
    """The GPU model as the provider names it."""
    num_gpus: int
    gpu_ram_gb: float | None
    """Memory per GPU in GB, where the provider says."""
    price_per_hour: float
    """On demand."""
    region: str
    """Where the machine is, as the provider writes it (``Norway, NO``, ``EU-RO-1``)."""
    interruptible: bool = False
    """Rentable as an interruptible (bid, spot) instance the provider may take back."""
    min_bid_per_hour: float | None = None
    """The least an interruptible rental of it takes; None where it cannot be bid on."""
    reliability: float | None = None
    """The provider's reliability figure for the machine (0-1), where it has one."""
    machine_id: str | None = None
    """The physical machine, for the host ledger: several offers can share one, and its
    faults follow it. None where the provider does not say (the ledger cannot help)."""
    host_id: str | None = None
    """Who runs the machine, where the provider says."""
    data: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The provider's own fields, opaque: only the provider reads them."""

    def bid(self, interruptible: bool | float) -> float | None:
        """The bid for this offer: None on demand; ``true`` bids its minimum, a number
        bids itself."""
        if interruptible is False:
            return None
        if interruptible is True:
            return self.min_bid_per_hour or 0.0
        return float(interruptible)

    def price(self, interruptible: bool | float) -> float:
        """What renting it costs per hour: the bid when interruptible, else on demand."""
        bid = self.bid(interruptible)
        return self.price_per_hour if bid is None else bid

    def affordable(self, cap: float, interruptible: bool | float) -> bool:
        """At or under ``cap``, and (bidding) at or over the offer's minimum bid."""
        price = self.price(interruptible)
        floor = self.min_bid_per_hour or 0.0
        return price <= cap and (interruptible is False or price >= floor)

    def describe(self) -> str:
        return f"offer {self.id}: {self.num_gpus}x {self.gpu_name} in {self.region}"


ORDER_MEASURED = "measured"
"""``order: measured``: by expected $ per training sample (the host ledger's figures)."""
ORDER_PRICE = "price"
"""``order: price``: cheapest first (also what ``measured`` searches by)."""


@dataclass(frozen=True)
class OfferRequirements:
    """What the user wants rented, stated once for every provider (hosts.yaml's rented
    entry); each provider translates it into its own search.

    A provider's :meth:`Provider.search` returns the offers that meet every field except
    the price cap (so the caller can name the cheapest near miss); :meth:`admits` is the
    same test in Python, for providers whose API cannot say all of it.
    """

    gpu_names: tuple[str, ...] = ()
    """GPU models (:func:`gpu_matches`); empty: any."""
    num_gpus: int | None = None
    """GPUs per instance, exactly; None: any."""
    min_gpu_ram_gb: float | None = None
    max_price_per_hour: float | None = None
    """The cap on :meth:`Offer.price` (applied by the caller, not the search)."""
    interruptible: bool | float = False
    """False: on demand. True: bid each offer's minimum. A number: bid that, $/h."""
    regions: tuple[str, ...] = ()
    """Case-insensitive substrings of :attr:`Offer.region`; empty: anywhere."""
    min_reliability: float | None = None
    disk_gb: float = 32.0
    query: str | None = None
    """The provider's own query, narrowing the search further (the escape hatch)."""
    order: str = ORDER_PRICE
    """:data:`ORDER_PRICE`, or the provider's own sort field. (``measured`` is the managed
    run's ranking over a search by price.)"""

    @classmethod
    def of(cls, spec: RentedHost) -> OfferRequirements:
        """The requirements of a rented hosts.yaml entry."""
        order = ORDER_PRICE if spec.order in (ORDER_MEASURED, ORDER_PRICE) else spec.order
        return cls(
            gpu_names=tuple(spec.gpu),
            num_gpus=spec.gpus or None,
            min_gpu_ram_gb=spec.min_vram_gb,
            max_price_per_hour=spec.max_price_per_hour,
            interruptible=spec.interruptible,
            regions=tuple(spec.region),
            min_reliability=spec.min_reliability,
            disk_gb=spec.disk_gb,
            query=spec.offer,
            order=order,
        )

    def admits(self, offer: Offer) -> bool:
        """Whether ``offer`` meets every requirement but the price cap."""
        return (
            (not self.gpu_names or any(gpu_matches(g, offer.gpu_name) for g in self.gpu_names))
            and (self.num_gpus is None or offer.num_gpus == self.num_gpus)
            and (
                self.min_gpu_ram_gb is None
                or (offer.gpu_ram_gb is not None and offer.gpu_ram_gb >= self.min_gpu_ram_gb)
            )
            and (not self.regions or any(r.lower() in offer.region.lower() for r in self.regions))
            and (
                self.min_reliability is None
                or (offer.reliability is not None and offer.reliability >= self.min_reliability)
            )
            and (self.interruptible is False or offer.interruptible)
        )

    def describe(self) -> str:
        """The requirements in a few words, for messages (``2x RTX 4090, >= 24 GB``)."""
        parts = []
        if self.gpu_names:
            count = f"{self.num_gpus}x " if self.num_gpus else ""
            parts.append(count + " or ".join(self.gpu_names))
        elif self.num_gpus:
            parts.append(f"{self.num_gpus} GPU(s)")
        if self.min_gpu_ram_gb:
            parts.append(f">= {self.min_gpu_ram_gb:g} GB per GPU")
        if self.regions:
            parts.append("in " + " or ".join(self.regions))
        if self.min_reliability:
            parts.append(f"reliability >= {self.min_reliability:g}")
        if self.query:
            parts.append(f"query {self.query!r}")
        return ", ".join(parts) or "any offer"


# -- instances --------------------------------------------------------------------------


class InstanceState(enum.Enum):
    """One instance's state, as every provider reports it::

    LOADING --> RUNNING --> STOPPED          (stopped by us or by the user)
       |           |------> OUTBID           (the provider took it back: a bid lost,
       |           |                          a spot pod interrupted)
       |           '------> GONE             (destroyed; the provider no longer lists it)
       '------> FAILED                       (image pull error, offline host)
    """

    LOADING = "loading"
    RUNNING = "running"
    STOPPED = "stopped"
    OUTBID = "outbid"
    FAILED = "failed"
    GONE = "gone"


@dataclass(frozen=True)
class Instance:
    """One rented instance as the core reads it, whatever its provider."""

    id: str
    provider: str
    label: str
    """The label (or name) ups gave it: :func:`parse_label` reads the run and epoch."""
    state: InstanceState
    status_message: str = ""
    """The provider's own words about its state (``Error response from daemon: ...``)."""
    ssh_host: str | None = None
    ssh_port: int | None = None
    """Where SSH answers once RUNNING (None before)."""
    price_per_hour: float = 0.0
    """What it bills now, $/h (the bid for an interruptible one)."""
    uptime_s: float = 0.0
    """Seconds since it was created (what its cost so far is reckoned over)."""
    machine_id: str | None = None
    """The physical machine (:attr:`Offer.machine_id`), where the provider says."""
    data: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The provider's own fields, opaque: only the provider reads them."""

    @property
    def run(self) -> RunLabel | None:
        """The run (and creator's epoch) its label names; None when ups did not create it."""
        return parse_label(self.label)

    @property
    def cost_so_far(self) -> float:
        """Estimate: the current $/h over the time since it was created."""
        return self.price_per_hour * self.uptime_s / 3600.0


@dataclass(frozen=True)
class CreateRequest:
    """What a supervisor asks a provider to create for a run: nothing secret in it."""

    run_id: str
    host: str
    """The hosts.yaml entry renting it."""
    epoch: int
    """The lease epoch of the supervisor sending the create (:class:`RunLabel`)."""
    image: str
    disk_gb: float
    onstart: str
    """The shell script the instance runs at boot, before ups reaches it over SSH: it
    starts the watchdog (:class:`ComputeWithSelfDestruct`). Kept under 4 KB."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment the instance starts with: never a secret (secrets go over SSH, 0600)."""
    bid_per_hour: float | None = None
    """None: on demand; else the bid for the whole instance, $/h (a provider that bids
    per GPU divides it)."""

    @property
    def label(self) -> str:
        """The label (or name) the instance must carry: the provider sets it at create."""
        return label_for(self.host, self.run_id, self.epoch)


# -- what a provider declares -----------------------------------------------------------


@dataclass(frozen=True)
class Capabilities:
    """What a provider can do: the managed run asks these, never the provider's name."""

    interruptible: bool
    """It rents interruptible instances (bids, spot) that it may take back (OUTBID)."""
    stop_resume: bool
    """A stopped instance keeps its disk and can be started again
    (:class:`ComputeWithStopResume`); a stopped one may still bill its storage."""
    labels: bool
    """Every instance carries the label ups gives it and is listed with it: the run's
    instances are found by label after every create and by the fence."""
    self_destruct: bool
    """A watchdog on the instance can end it without the account key
    (:class:`ComputeWithSelfDestruct`): ``max_hours`` and ``start_timeout_s`` hold
    with no laptop."""
    machine_identity: bool
    """Offers name the physical machine (:attr:`Offer.machine_id`): the host ledger can
    leave a machine that failed out of later searches."""


@dataclass(frozen=True)
class Backoff:
    """How long a provider's callers wait between tries (``ups.backoff.Policy`` each);
    *whether* a call is tried again is ``ups.retry.API_RETRY``."""

    api: Policy
    """An API call answered 429/5xx without a Retry-After header."""
    destroy: Policy
    """A destroy tried again after a server error, and the instance shown until gone."""
    running: Policy
    """Polling a new instance until it runs (the growth keeps within the rate limit)."""
    ssh: Policy
    """A running instance whose sshd or keys are not there yet."""


# -- the provider -----------------------------------------------------------------------


class Provider(Protocol):
    """The calls a managed run makes on a provider.

    Every call that fails raises :class:`ProviderApiError` worded by :func:`api_error`
    (its :attr:`~ProviderApiError.kind` set by :meth:`classify`), after the retries
    ``ups.retry.API_RETRY`` allows, waiting per :attr:`backoff`. No call takes or logs
    the account key: the provider's SDK finds it where :attr:`account` says.
    """

    name: str
    """The registry's name (``vast``), also each offer's and instance's ``provider``."""
    account: Account
    capabilities: Capabilities
    backoff: Backoff

    def search(self, requirements: OfferRequirements) -> list[Offer]:
        """Offers meeting ``requirements`` except the price cap, in its ``order``
        (cheapest first by :meth:`Offer.price` for :data:`ORDER_PRICE`). Creates nothing."""
        ...

    def create(self, offer: Offer, request: CreateRequest) -> str:
        """Rent ``offer`` as ``request`` says, labelled ``request.label``; the new
        instance's id. Not idempotent: a create whose answer was lost may have made an
        instance, so the caller lists the run's instances after every create
        (:meth:`list`). An offer rented by someone else first raises :class:`OfferTaken`."""
        ...

    def get(self, instance_id: str) -> Instance | None:
        """The instance now, or None when the provider no longer lists it (GONE)."""
        ...

    def list(self, run_id: str | None = None) -> list[Instance]:
        """Every instance of this account that carries a ups label (:func:`parse_label`),
        whatever its entry or epoch; only ``run_id``'s when given. Reconciled against
        what the API lists now, never a cache."""
        ...

    def stop(self, instance_id: str) -> None:
        """Stop it: GPU billing ends (a provider with ``stop_resume`` keeps its disk,
        which may still bill)."""
        ...

    def destroy(self, instance_id: str) -> None:
        """End it for good; billing ends. Destroying one already gone is not an error."""
        ...

    def fault_of(self, instance: Instance) -> Fault | None:
        """Whose fault it is that ``instance`` will never run, and what it means in a few
        words; None when its status says nothing fatal."""
        ...

    def classify(self, status: int | None, body: object) -> ApiErrorKind:
        """What an API answer means: by the body's own error code first, the HTTP status
        only where the body says nothing (``body`` is the parsed JSON, or the text)."""
        ...


class ComputeWithStopResume(Protocol):
    """A provider with :attr:`Capabilities.stop_resume`."""

    def resume(self, instance_id: str) -> None:
        """Start a stopped instance again, with its disk as it was."""
        ...


class ComputeWithSelfDestruct(Protocol):
    """What a provider with :attr:`Capabilities.self_destruct` gives the watchdog ON the
    instance (:func:`ProviderPackage.on_instance`): no account key is ever there, only the
    scoped key the user sent (``watchdog_key_file``) or the instance's own, from the
    environment the provider sets."""

    def instance_id(self) -> str | None:
        """This instance's id, from the environment the provider gives it."""
        ...

    def end_self(self, action: str) -> None:
        """``destroy`` (or ``stop``) this very instance. Raises :class:`ProviderApiError`:
        kind ``KEY_MISSING`` when there is no key to act with, ``KEY_REJECTED`` when the key
        may not do it (the watchdog then stops instead, which ends GPU billing), any other
        when the API cannot answer (the watchdog tries again)."""
        ...


class ProviderPackage(Protocol):
    """What each provider's package (``ups/deploy/providers/<name>/__init__.py``) exposes
    to the registry. Importing it must not import the provider's SDK (a docker deploy
    never loads it): ``open_provider`` and ``on_instance`` import it when called."""

    Options: type[RentedHost]
    """Its hosts.yaml entry: a :class:`~ups.deploy.entries.RentedHost` with
    ``kind: Literal["<name>"]`` and its own options (e.g. its API's URL)."""

    def open_provider(self, options: RentedHost) -> Provider:
        """The provider on this machine, opened for one entry (the account key is found by
        its SDK, never passed on a command line)."""
        ...

    def on_instance(self, endpoint: str | None, key: str | None) -> ComputeWithSelfDestruct:
        """The provider as its watchdog sees it on the instance: ``key`` is the scoped key
        from ``watchdog_key_file`` (None: the instance's own), ``endpoint`` the API URL
        the entry names (None: the provider's own)."""
        ...

    def watchdog_endpoint(self, options: RentedHost) -> str | None:
        """The API URL the watchdog on the instance uses for this entry (None: default)."""
        ...


# -- recovery: where a run goes next ----------------------------------------------------


class Trigger(enum.Enum):
    """What made the run look for somewhere else to train."""

    NO_OFFER = "no_offer"
    """The entry's provider has no offer meeting the requirements under the cap."""
    BAD_HOST = "bad_host"
    """An instance failed on its machine (a host fault): counted in a row per entry."""
    OFFER_TAKEN = "offer_taken"
    """The offer was rented by someone else first."""
    LOST = "lost"
    """A training instance was lost (outbid, vanished, SSH gone): a recovery."""


@dataclass(frozen=True)
class Situation:
    """What the :class:`RecoveryPolicy` decides on."""

    trigger: Trigger
    entry: str
    """The rented hosts.yaml entry it happened on (an entry names its provider)."""
    reason: str
    """In words: what failed (goes into the record with the decision)."""
    in_a_row: int
    """How many times in a row this trigger hit this entry (bad hosts, taken offers, no
    offer), this one included."""
    entries: tuple[str, ...]
    """Every entry the run may rent from, in the order the user listed them."""
    without_offer: frozenset[str] = frozenset()
    """Entries whose last search found no offer under the cap (since a rental succeeded)."""


class Move(enum.Enum):
    NEXT_OFFER = "next_offer"
    """Rent the next matching offer on the same entry (its provider)."""
    NEXT_PROVIDER = "next_provider"
    """Continue the same run on another entry, from the run's newest checkpoint."""
    WAIT = "wait"
    """Wait :attr:`Decision.wait_s`, then search :attr:`Decision.entry` again."""
    GIVE_UP = "give_up"
    """Stop: the caller raises its error (no offer, offers exhausted)."""


@dataclass(frozen=True)
class Decision:
    move: Move
    entry: str
    """Where to rent next (the same entry for NEXT_OFFER and WAIT)."""
    reason: str
    """Why, in words: the run record keeps it with every move between providers."""
    wait_s: float = 0.0


class RecoveryPolicy(Protocol):
    """Where a run goes when an offer, a host or an instance fails it: one named,
    swappable object (SkyPilot's ``recovery_strategy``). The managed run asks it at every
    trigger and carries out the decision; it holds no state of its own beyond its
    settings (what it needs is in the :class:`Situation`)."""

    name: str

    def decide(self, situation: Situation) -> Decision: ...
