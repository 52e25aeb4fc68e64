"""Deterministic transaction simulator: labelled card transactions with realistic fraud.

``simulate`` draws customers (home country and location), their cards, merchants
(category, country, location, 1-3 terminals) and card transactions over ``days`` days
ending at ``end`` (default: today's UTC midnight, so the newest features are fresh for
today's traffic). Customers mostly shop at a few favourite merchants near home, at their
local daytime, sometimes online, sometimes abroad. About 1% of transactions are fraud,
each tagged with the scenario that produced it (see ``SCENARIOS``). One numpy Generator
seeded from ``seed`` draws everything in a fixed order: the same seed and parameters give
byte-identical Parquet files.

The simulator produces raw transactions and labels only: ``transactions.parquet``'s rows
in the schema every dataset has (``domain.aggregation.RAW_COLUMNS``), plus ``customer_id``
and ``fraud_scenario`` (which pattern produced a fraud; training reports recall per
pattern). ``pipelines.dataset`` computes the feature tables from them with the same
aggregation the live updater applies per event. Card timestamps are made strictly
increasing (whole seconds), so each card row stands for exactly one transaction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.domain import featurespec, money

LEGIT = "none"
"""``fraud_scenario`` of a genuine transaction."""
SCENARIOS: dict[str, float] = {
    "compromised_card": 0.0035,
    "card_testing": 0.0020,
    "compromised_terminal": 0.0020,
    "geo_mismatch": 0.0015,
    "odd_hour": 0.0015,
}
"""Fraud scenarios and the number of their transactions per genuine transaction."""


# Countries: ISO 3166 numeric code, currency, (lat, lon) centre, UTC offset in hours,
# share of customers, share of merchants.
_COUNTRIES: tuple[tuple[int, str, float, float, int, float, float], ...] = (
    (276, "EUR", 51.0, 10.0, 1, 0.25, 0.21),  # DE
    (250, "EUR", 47.0, 2.0, 1, 0.17, 0.14),  # FR
    (528, "EUR", 52.2, 5.3, 1, 0.08, 0.07),  # NL
    (724, "EUR", 40.0, -4.0, 1, 0.12, 0.10),  # ES
    (380, "EUR", 42.5, 12.5, 1, 0.12, 0.10),  # IT
    (826, "GBP", 54.0, -2.0, 0, 0.12, 0.11),  # GB
    (756, "CHF", 46.8, 8.2, 1, 0.05, 0.05),  # CH
    (752, "SEK", 62.0, 15.0, 1, 0.05, 0.05),  # SE
    (840, "USD", 39.0, -98.0, -6, 0.04, 0.09),  # US
    (392, "JPY", 36.0, 138.0, 9, 0.00, 0.04),  # JP
    (76, "BRL", -10.0, -52.0, -3, 0.00, 0.02),  # BR
    (764, "THB", 15.0, 100.0, 7, 0.00, 0.02),  # TH
)
_CODE = np.array([c[0] for c in _COUNTRIES])
_CURRENCY = np.array([c[1] for c in _COUNTRIES])
_CENTRE = np.array([(c[2], c[3]) for c in _COUNTRIES])
_UTC_OFFSET = np.array([c[4] for c in _COUNTRIES])
_CUSTOMER_SHARE = np.array([c[5] for c in _COUNTRIES])
_MERCHANT_SHARE = np.array([c[6] for c in _COUNTRIES])
_NEAR = np.arange(8)  # Europe: where customers live and mostly travel.
_ONLINE_HOMES = np.arange(9)  # Europe and the US: where web shops sit.
_FAR = np.arange(8, len(_COUNTRIES))  # Where cloned cards turn up.

# Merchant categories (MCC), typical amount in EUR, share among physical / online merchants.
_CATEGORIES: tuple[tuple[int, float, float, float], ...] = (
    (5411, 35.0, 0.25, 0.00),  # grocery
    (5812, 28.0, 0.22, 0.00),  # restaurants
    (5541, 55.0, 0.10, 0.00),  # fuel
    (5311, 60.0, 0.08, 0.00),  # department stores
    (5912, 22.0, 0.08, 0.00),  # pharmacies
    (4111, 8.0, 0.05, 0.00),  # local transport
    (7011, 180.0, 0.04, 0.00),  # hotels
    (5944, 300.0, 0.03, 0.00),  # jewellery
    (5999, 40.0, 0.10, 0.20),  # miscellaneous retail
    (5732, 150.0, 0.05, 0.15),  # electronics
    (5815, 12.0, 0.00, 0.30),  # digital goods
    (5734, 45.0, 0.00, 0.20),  # software
    (4722, 350.0, 0.00, 0.15),  # travel agencies
)
_MCC = np.array([c[0] for c in _CATEGORIES])
_TYPICAL_EUR = np.array([c[1] for c in _CATEGORIES])
_PHYSICAL_SHARE = np.array([c[2] for c in _CATEGORIES])
_ONLINE_SHARE = np.array([c[3] for c in _CATEGORIES])
_HIGH_VALUE_MCC = np.array([5732, 5944, 4722, 5311, 5734])
_TESTING_MCC = np.array([5815, 5734, 5999])

# Share of a day's spending per local hour: little at night, most at midday and evening.
_HOUR_WEIGHT = np.array(
    [1.2, 0.6, 0.35, 0.25, 0.25, 0.4, 1.0, 2.2, 3.5, 4.5, 5.2, 5.8,
     6.5, 6.2, 5.8, 5.6, 5.8, 6.3, 6.6, 6.0, 4.8, 3.6, 2.6, 1.8]
)  # fmt: skip
_HOUR_P = _HOUR_WEIGHT / _HOUR_WEIGHT.sum()

_DAY = 86_400
_HOUR = 3_600
_BLOCK = np.int64(1) << 40  # entity index * _BLOCK + epoch seconds sorts by entity, then time
_FAVOURITES = 8  # physical merchants a customer mostly shops at
_ONLINE_FAVOURITES = 4
_SECOND_CARD_SHARE = 0.3
_TXN_PER_CARD_DAY = 0.42
_ONLINE_MERCHANT_SHARE = 0.2
_MAX_AMOUNT_EUR = 20_000.0


@dataclass(frozen=True)
class SimulationParams:
    """What to simulate; equal params (``end`` included) give identical output."""

    seed: int = 7
    """Seed of the one numpy Generator that draws everything."""
    n_customers: int = 4_000
    """Cardholders; about 30% of them have a second card."""
    n_merchants: int = 800
    """Merchants; a fifth of them sell online (card not present)."""
    days: int = 90
    """Length of the window."""
    end: date | None = None
    """Last day's end (exclusive, UTC midnight); None means today's UTC midnight."""

    @property
    def end_time(self) -> datetime:
        """The end of the window as a UTC datetime."""
        end = self.end or datetime.now(UTC).date()
        return datetime.combine(end, time(0), tzinfo=UTC)

    @property
    def start_time(self) -> datetime:
        """The start of the window as a UTC datetime."""
        return self.end_time - timedelta(days=self.days)


PRESETS: dict[str, SimulationParams] = {
    "default": SimulationParams(),
    "small": SimulationParams(n_customers=1_200, n_merchants=300, days=60),
}
"""Sizes: ``default`` (~200k transactions) for the mesh, ``small`` (~40k) for tests."""


def preset(name: str, *, seed: int | None = None, end: date | None = None) -> SimulationParams:
    """A preset's params with the seed and end overridden where given."""
    try:
        params = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
    if seed is not None:
        params = replace(params, seed=seed)
    return replace(params, end=end)


class SimulatorSettings(BaseSettings):
    """What ``fraudmesh features simulate`` draws unless its options say otherwise."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_SIMULATOR_", extra="ignore", frozen=True)

    preset: Literal["default", "small"] = Field(
        "default", description="Size: default (~200k transactions) or small (~40k)."
    )
    seed: int = Field(7, description="Seed of the one random generator; equal seeds, equal data.")
    end: date | None = Field(
        None, description="End of the window (UTC midnight, exclusive); unset means today."
    )

    def params(self) -> SimulationParams:
        """The preset's parameters with this seed and end."""
        return preset(self.preset, seed=self.seed, end=self.end)


@dataclass(frozen=True)
class Simulation:
    """The simulated world's labelled transactions (the raw input of ``pipelines.dataset``)."""

    params: SimulationParams
    transactions: pd.DataFrame


Progress = Callable[[str], None]
"""Called with the name of each step as it starts."""


def simulate(params: SimulationParams, progress: Progress | None = None) -> Simulation:
    """Simulates labelled transactions (``domain.aggregation.RAW_COLUMNS`` plus ids of the
    customer and the fraud scenario)."""
    say = progress or (lambda _: None)
    if params.n_customers < 10 or params.days < 8:
        raise ValueError("simulate at least 10 customers over at least 8 days")
    rng = np.random.default_rng(params.seed)
    start_s = int(params.start_time.timestamp())
    end_s = int(params.end_time.timestamp())
    say("drawing customers, cards and merchants")
    world = _World.draw(rng, params)
    say("drawing genuine transactions")
    legit = _legit_transactions(rng, world, start_s, end_s)
    say("drawing fraud")
    fraud = _fraud_transactions(rng, world, legit, start_s, end_s)
    tx = _finish(world, _concat([legit, *fraud]), end_s)
    return Simulation(params, _transactions_frame(world, tx))


# --- the world ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _World:
    """Customers, cards and merchants as parallel arrays (index = id number)."""

    customer_country: np.ndarray  # index into _COUNTRIES
    customer_favourites: np.ndarray  # [customers, _FAVOURITES] physical merchant indices
    customer_online: np.ndarray  # [customers, _ONLINE_FAVOURITES] online merchant indices
    card_customer: np.ndarray
    card_rate: np.ndarray  # transactions per day
    card_level: np.ndarray  # spending multiplier
    card_online_p: np.ndarray
    card_abroad_p: np.ndarray
    merchant_country: np.ndarray
    merchant_online: np.ndarray
    merchant_category: np.ndarray  # index into _CATEGORIES
    merchant_popularity: np.ndarray
    merchant_terminals: np.ndarray

    @property
    def n_cards(self) -> int:
        return len(self.card_customer)

    @property
    def card_country(self) -> np.ndarray:
        return self.customer_country[self.card_customer]

    @classmethod
    def draw(cls, rng: np.random.Generator, params: SimulationParams) -> _World:
        n_c, n_m = params.n_customers, params.n_merchants
        customer_country = rng.choice(len(_COUNTRIES), size=n_c, p=_CUSTOMER_SHARE)
        customer_xy = _CENTRE[customer_country] + rng.normal(0.0, 1.5, size=(n_c, 2))

        merchant_online = np.zeros(n_m, dtype=bool)
        merchant_online[rng.permutation(n_m)[: round(n_m * _ONLINE_MERCHANT_SHARE)]] = True
        merchant_country = _merchant_countries(rng, merchant_online)
        merchant_category = np.where(
            merchant_online,
            rng.choice(len(_CATEGORIES), size=n_m, p=_ONLINE_SHARE),
            rng.choice(len(_CATEGORIES), size=n_m, p=_PHYSICAL_SHARE),
        )
        merchant_xy = _CENTRE[merchant_country] + rng.normal(0.0, 1.5, size=(n_m, 2))
        popularity = rng.lognormal(0.0, 1.0, size=n_m)
        terminals = rng.integers(1, 4, size=n_m)

        # Favourites: popular physical merchants near home (Gumbel top-k sampling).
        distance = np.hypot(*(customer_xy[:, None, :] - merchant_xy[None, :, :]).transpose(2, 0, 1))
        same_country = customer_country[:, None] == merchant_country[None, :]
        with np.errstate(divide="ignore"):
            log_w = np.where(
                same_country & ~merchant_online[None, :],
                np.log(popularity)[None, :] - distance / 0.8,
                -np.inf,
            )
        favourites = _top_k(log_w + rng.gumbel(size=log_w.shape), _FAVOURITES)
        online_idx = np.flatnonzero(merchant_online)
        online_keys = np.log(popularity[online_idx])[None, :] + rng.gumbel(
            size=(n_c, len(online_idx))
        )
        online = online_idx[_top_k(online_keys, _ONLINE_FAVOURITES)]

        n_cards = 1 + (rng.random(n_c) < _SECOND_CARD_SHARE)
        card_customer = np.repeat(np.arange(n_c), n_cards)
        n = len(card_customer)
        sigma = 0.55
        return cls(
            customer_country=customer_country,
            customer_favourites=favourites,
            customer_online=online,
            card_customer=card_customer,
            card_rate=rng.lognormal(math.log(_TXN_PER_CARD_DAY) - sigma**2 / 2, sigma, size=n),
            card_level=rng.lognormal(0.0, 0.35, size=n),
            card_online_p=rng.beta(2.0, 8.0, size=n),
            card_abroad_p=rng.beta(1.0, 40.0, size=n),
            merchant_country=merchant_country,
            merchant_online=merchant_online,
            merchant_category=merchant_category,
            merchant_popularity=popularity,
            merchant_terminals=terminals,
        )


def _merchant_countries(rng: np.random.Generator, online: np.ndarray) -> np.ndarray:
    """Countries by share, with enough physical merchants everywhere for the favourites."""
    n_physical = int((~online).sum())
    # Customers' countries need enough shops for their favourites; far ones only a few.
    minimum = np.where(_CUSTOMER_SHARE > 0, _FAVOURITES, 2)
    counts = np.maximum(minimum, np.round(_MERCHANT_SHARE * n_physical)).astype(int)
    counts[0] += n_physical - counts.sum()
    if counts[0] < minimum[0]:
        raise ValueError(
            f"too few merchants: need at least {minimum.sum()} physical ones, have {n_physical}"
        )
    physical = rng.permutation(np.repeat(np.arange(len(_COUNTRIES)), counts))
    country = np.empty(len(online), dtype=int)
    country[~online] = physical
    country[online] = rng.choice(
        _ONLINE_HOMES, size=int(online.sum()), p=_norm(_MERCHANT_SHARE[_ONLINE_HOMES])
    )
    return country


def _norm(weights: np.ndarray) -> np.ndarray:
    return weights / weights.sum()


def _top_k(keys: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's k largest keys, largest first."""
    part = np.argpartition(-keys, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(keys, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def _pick(rng: np.random.Generator, pool: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """``n`` draws from ``pool`` with probability proportional to ``weights[pool]``."""
    return rng.choice(pool, size=n, p=_norm(weights[pool]))


# --- transactions -----------------------------------------------------------------------

# Parallel arrays: card, merchant, terminal (index within the merchant), t (epoch s),
# eur, scenario (index into _SCENARIO_NAMES; 0 = legit).
_Tx = dict[str, np.ndarray]
_SCENARIO_NAMES = (LEGIT, *SCENARIOS)


def _concat(parts: list[_Tx]) -> _Tx:
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def _make(
    card: np.ndarray,
    merchant: np.ndarray,
    terminal: np.ndarray,
    t: np.ndarray,
    eur: np.ndarray,
    scenario: str,
) -> _Tx:
    n = len(card)
    return {
        "card": np.asarray(card, dtype=np.int64),
        "merchant": np.asarray(merchant, dtype=np.int64),
        "terminal": np.asarray(terminal, dtype=np.int64),
        "t": np.asarray(t, dtype=np.int64),
        "eur": np.asarray(eur, dtype=np.float64),
        "scenario": np.full(n, _SCENARIO_NAMES.index(scenario), dtype=np.int8),
    }


def _terminals(rng: np.random.Generator, world: _World, merchant: np.ndarray) -> np.ndarray:
    """A uniformly chosen terminal of each merchant."""
    return rng.integers(0, world.merchant_terminals[merchant])


def _local_hour_to_utc_s(world: _World, card: np.ndarray, hour: np.ndarray) -> np.ndarray:
    offset = _UTC_OFFSET[world.card_country[card]]
    return ((hour - offset) % 24) * _HOUR


def _legit_transactions(rng: np.random.Generator, world: _World, start_s: int, end_s: int) -> _Tx:
    days = (end_s - start_s) // _DAY
    counts = rng.poisson(world.card_rate * days)
    card = np.repeat(np.arange(world.n_cards), counts)
    n = len(card)
    customer = world.card_customer[card]
    day = rng.integers(0, days, size=n)
    hour = rng.choice(24, size=n, p=_HOUR_P)
    t = start_s + day * _DAY + _local_hour_to_utc_s(world, card, hour) + rng.integers(0, _HOUR, n)

    merchant = np.empty(n, dtype=np.int64)
    online = rng.random(n) < world.card_online_p[card]
    abroad = ~online & (rng.random(n) < world.card_abroad_p[card])
    favourite = ~online & ~abroad & (rng.random(n) < 0.85)
    wander = ~online & ~abroad & ~favourite
    rank_p = _norm(1.0 / np.arange(1, _FAVOURITES + 1))
    merchant[favourite] = world.customer_favourites[
        customer[favourite], rng.choice(_FAVOURITES, size=int(favourite.sum()), p=rank_p)
    ]
    online_fav = online & (rng.random(n) < 0.8)
    merchant[online_fav] = world.customer_online[
        customer[online_fav], rng.integers(0, _ONLINE_FAVOURITES, size=int(online_fav.sum()))
    ]
    pop = world.merchant_popularity
    online_pool = np.flatnonzero(world.merchant_online)
    other_online = online & ~online_fav
    merchant[other_online] = _pick(rng, online_pool, pop, int(other_online.sum()))
    physical = ~world.merchant_online
    near_physical = np.flatnonzero(physical & np.isin(world.merchant_country, _NEAR))
    merchant[abroad] = _pick(rng, near_physical, pop, int(abroad.sum()))
    # Wandering: any physical shop in the home country, by popularity.
    home = world.card_country[card]
    for country in np.unique(home[wander]):
        rows = wander & (home == country)
        pool = np.flatnonzero(physical & (world.merchant_country == country))
        merchant[rows] = _pick(rng, pool, pop, int(rows.sum()))

    typical = _TYPICAL_EUR[world.merchant_category[merchant]]
    eur = typical * world.card_level[card] * rng.lognormal(-0.18, 0.6, size=n)
    return _make(card, merchant, _terminals(rng, world, merchant), t, eur, LEGIT)


def _fraud_transactions(
    rng: np.random.Generator, world: _World, legit: _Tx, start_s: int, end_s: int
) -> list[_Tx]:
    n_legit = len(legit["card"])
    scenarios = {
        "compromised_card": _compromised_card,
        "card_testing": _card_testing,
        "compromised_terminal": _compromised_terminal,
        "geo_mismatch": _geo_mismatch,
        "odd_hour": _odd_hour,
    }
    out = []
    for name, share in SCENARIOS.items():
        target = round(share * n_legit)
        parts: list[_Tx] = []
        made = 0
        # Whole incidents until the scenario's share is reached: deterministic and
        # independent of how transactions spread over cards and terminals.
        while made < target:
            part = scenarios[name](rng, world, legit, start_s, end_s)
            parts.append(part)
            made += len(part["card"])
        out.append(_concat(parts))
    return out


def _pool(world: _World, online: bool | None, mccs: np.ndarray | None = None) -> np.ndarray:
    mask = np.ones(len(world.merchant_online), dtype=bool)
    if online is not None:
        mask &= world.merchant_online == online
    if mccs is not None:
        mask &= np.isin(_MCC[world.merchant_category], mccs)
    pool = np.flatnonzero(mask)
    if len(pool) == 0:
        raise ValueError("too few merchants to simulate every fraud scenario")
    return pool


def _compromised_card(
    rng: np.random.Generator, world: _World, legit: _Tx, start_s: int, end_s: int
) -> _Tx:
    """A stolen card number: a run of unusual high-value purchases over hours to days."""
    card = int(rng.integers(world.n_cards))
    n = int(rng.integers(3, 11))
    t0 = rng.integers(start_s, end_s - _DAY)
    t = t0 + np.sort(rng.integers(0, int(rng.integers(6 * _HOUR, 3 * _DAY)), size=n))
    online = rng.random(n) < 0.7
    merchant = np.where(
        online,
        _pick(rng, _pool(world, True, _HIGH_VALUE_MCC), world.merchant_popularity, n),
        _pick(rng, _pool(world, False, _HIGH_VALUE_MCC), world.merchant_popularity, n),
    )
    eur = rng.lognormal(math.log(280.0), 0.7, size=n)
    terminal = _terminals(rng, world, merchant)
    return _make(np.full(n, card), merchant, terminal, t, eur, "compromised_card")


def _card_testing(
    rng: np.random.Generator, world: _World, legit: _Tx, start_s: int, end_s: int
) -> _Tx:
    """Many tiny online charges within minutes to test the card, then a large one."""
    card = int(rng.integers(world.n_cards))
    n_small = int(rng.integers(5, 16))
    n_large = int(rng.integers(1, 3))
    t0 = int(rng.integers(start_s, end_s - _HOUR))
    t_small = t0 + np.cumsum(rng.integers(5, 60, size=n_small))
    t_large = t_small[-1] + np.cumsum(rng.integers(60, 1_800, size=n_large))
    testing_pool = _pool(world, True, _TESTING_MCC)
    if rng.random() < 0.7:
        small_merchant = np.full(n_small, rng.choice(testing_pool))
    else:
        small_merchant = rng.choice(testing_pool, size=n_small)
    large_merchant = _pick(
        rng, _pool(world, True, _HIGH_VALUE_MCC), world.merchant_popularity, n_large
    )
    eur = np.concatenate(
        [rng.uniform(0.3, 1.99, size=n_small), rng.lognormal(math.log(450.0), 0.6, size=n_large)]
    )
    merchant = np.concatenate([small_merchant, large_merchant])
    t = np.concatenate([t_small, t_large])
    terminal = _terminals(rng, world, merchant)
    return _make(np.full(n_small + n_large, card), merchant, terminal, t, eur, "card_testing")


def _compromised_terminal(
    rng: np.random.Generator, world: _World, legit: _Tx, start_s: int, end_s: int
) -> _Tx:
    """A skimmer or colluding shop: for days, a share of a terminal's payments are fraud."""
    physical = _pool(world, False)
    merchant = int(rng.choice(physical))
    begin = int(rng.integers(start_s, end_s - 7 * _DAY))
    stop = min(end_s, begin + int(rng.integers(7, 22)) * _DAY)
    share = rng.uniform(0.3, 0.6)
    terminals = int(world.merchant_terminals[merchant])
    in_period = (legit["merchant"] == merchant) & (legit["t"] >= begin) & (legit["t"] < stop)
    # Legit traffic is spread evenly over a merchant's terminals.
    expected_legit = in_period.sum() / terminals
    n = int(rng.poisson(share / (1.0 - share) * max(expected_legit, 1.0)))
    card = rng.integers(world.n_cards, size=n)
    day = rng.integers(0, max(1, (stop - begin) // _DAY), size=n)
    local_hour = rng.integers(9, 21, size=n)
    offset = _UTC_OFFSET[world.merchant_country[merchant]]
    t = begin + day * _DAY + ((local_hour - offset) % 24) * _HOUR + rng.integers(0, _HOUR, size=n)
    typical = _TYPICAL_EUR[world.merchant_category[merchant]]
    eur = typical * rng.lognormal(math.log(2.5), 0.5, size=n)
    terminal = np.full(n, rng.integers(terminals))
    return _make(card, np.full(n, merchant), terminal, t, eur, "compromised_terminal")


def _geo_mismatch(
    rng: np.random.Generator, world: _World, legit: _Tx, start_s: int, end_s: int
) -> _Tx:
    """A cloned card used at shops in a far-away country."""
    card = int(rng.integers(world.n_cards))
    far = _FAR[world.card_country[card] != _FAR]
    country = rng.choice(far)
    pool = np.flatnonzero(~world.merchant_online & (world.merchant_country == country))
    n = int(rng.integers(2, 6))
    t0 = rng.integers(start_s, end_s - 2 * _DAY)
    t = t0 + np.sort(rng.integers(0, 36 * _HOUR, size=n))
    merchant = _pick(rng, pool, world.merchant_popularity, n)
    eur = rng.lognormal(math.log(320.0), 0.6, size=n)
    terminal = _terminals(rng, world, merchant)
    return _make(np.full(n, card), merchant, terminal, t, eur, "geo_mismatch")


def _odd_hour(rng: np.random.Generator, world: _World, legit: _Tx, start_s: int, end_s: int) -> _Tx:
    """High amounts in the middle of the cardholder's night."""
    card = int(rng.integers(world.n_cards))
    n = int(rng.integers(1, 4))
    day = rng.integers(0, (end_s - start_s) // _DAY)
    local_hour = rng.integers(1, 5, size=n)
    cards = np.full(n, card)
    t = start_s + day * _DAY + _local_hour_to_utc_s(world, cards, local_hour)
    t = t + rng.integers(0, _HOUR, size=n)
    # Mostly online; otherwise a pricey shop at home (small countries may have none).
    home_pool = np.flatnonzero(
        ~world.merchant_online
        & (world.merchant_country == world.card_country[card])
        & np.isin(_MCC[world.merchant_category], _HIGH_VALUE_MCC)
    )
    in_shop = len(home_pool) > 0 and rng.random() < 0.3
    pool = home_pool if in_shop else _pool(world, True, _HIGH_VALUE_MCC)
    merchant = _pick(rng, pool, world.merchant_popularity, n)
    eur = rng.lognormal(math.log(600.0), 0.5, size=n)
    return _make(cards, merchant, _terminals(rng, world, merchant), t, eur, "odd_hour")


def _finish(world: _World, tx: _Tx, end_s: int) -> _Tx:
    """Sorts by card and time, makes each card's timestamps strictly increasing, prices."""
    order = np.lexsort((tx["t"], tx["card"]))
    tx = {key: value[order] for key, value in tx.items()}
    card, t = tx["card"], tx["t"]
    n = len(card)
    # Strictly increasing within a card: t'[i] = r[i] + cummax(t[i] - r[i]), r = rank in card.
    # Cards are disjoint blocks of the sort, so one global running max over (card, t - r)
    # does it for all cards at once.
    rank = np.arange(n) - _first_rows(card)
    block = card * _BLOCK
    tx["t"] = np.maximum.accumulate(block + t - rank) - block + rank
    keep = tx["t"] < end_s
    tx = {key: value[keep] for key, value in tx.items()}

    # Price in the merchant's currency, then read the EUR amount back exactly the way
    # serving will (featurespec), so stored aggregates and request features agree.
    country = world.merchant_country[tx["merchant"]]
    scale = np.array([money.minor_per_major(c) for c in _CURRENCY])[country]
    rate = np.array([money.eur_per_unit(c) for c in _CURRENCY])[country]
    eur = np.clip(tx.pop("eur"), 0.3, _MAX_AMOUNT_EUR)
    tx["amount_minor"] = np.maximum(1, np.round(eur / rate * scale)).astype(np.int64)
    tx["eur"] = tx["amount_minor"] / scale * rate
    tx["currency"] = _CURRENCY[country]
    return tx


def _ids(prefix: str, n: int, width: int) -> np.ndarray:
    return np.array([f"{prefix}-{i:0{width}d}" for i in range(n)], dtype=object)


def _utc(seconds: np.ndarray) -> pd.Series:
    return pd.Series(pd.to_datetime(seconds, unit="s", utc=True)).astype("datetime64[us, UTC]")


def _transactions_frame(world: _World, tx: _Tx) -> pd.DataFrame:
    """The labelled transactions, sorted by time, with string ids."""
    order = np.lexsort((tx["card"], tx["t"]))
    merchant = tx["merchant"][order]
    card = tx["card"][order]
    merchant_ids = _ids("merch", len(world.merchant_online), 5)
    scenario = tx["scenario"][order]
    return pd.DataFrame(
        {
            "transaction_id": _ids("tx", len(order), 8),
            "timestamp": _utc(tx["t"][order]),
            "card_id": _ids("card", world.n_cards, 6)[card],
            "customer_id": _ids("cust", len(world.customer_country), 6)[world.card_customer[card]],
            "merchant_id": merchant_ids[merchant],
            "terminal_id": [
                f"{m}-t{k + 1}"
                for m, k in zip(merchant_ids[merchant], tx["terminal"][order], strict=True)
            ],
            "amount_minor": tx["amount_minor"][order],
            "currency": tx["currency"][order],
            "card_home_country": _CODE[world.card_country[card]],
            "merchant_country": _CODE[world.merchant_country[merchant]],
            "merchant_category": _MCC[world.merchant_category[merchant]],
            "channel": np.where(
                world.merchant_online[merchant],
                featurespec.CARD_NOT_PRESENT,
                featurespec.CARD_PRESENT,
            ),
            "is_fraud": scenario > 0,
            "fraud_scenario": np.array(_SCENARIO_NAMES, dtype=object)[scenario],
        }
    )


def _first_rows(entity: np.ndarray) -> np.ndarray:
    """For rows sorted by entity: the index of each row's entity's first row."""
    n = len(entity)
    starts = np.r_[True, entity[1:] != entity[:-1]]
    return np.maximum.accumulate(np.where(starts, np.arange(n), 0))
