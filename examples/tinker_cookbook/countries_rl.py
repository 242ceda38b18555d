"""An RL task for tinker-cookbook's `rl.train`, built from the cookbook's own types: a
`ProblemEnv` (an `Env`), `ProblemGroupBuilder` (an `EnvGroupBuilder`) and our
`CountriesDatasetBuilder` (an `RLDatasetBuilder`).

The task is reading comprehension with a distractor: the prompt states in which country
two cities lie and asks for one of them. The answer is always in the prompt, so the model
needs no world knowledge. Reward (the cookbook's `ProblemEnv` formula):
correct - 0.1 * (1 - well_formed), where correct = the reply (case and punctuation
folded) names the asked city's country and not the distractor's, and well_formed = the reply
ended with the renderer's stop token and has at most four words. A base
SmolLM2-135M-Instruct often rambles or repeats both facts, so the reward has room to rise.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Sequence

import chz
from tinker_cookbook import renderers
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

# (city, country): real places, but the answer is read from the prompt, not recalled
CITIES = [
    ("Lyon", "France"), ("Porto", "Portugal"), ("Kraków", "Poland"), ("Osaka", "Japan"),
    ("Busan", "South Korea"), ("Cork", "Ireland"), ("Graz", "Austria"), ("Bergen", "Norway"),
    ("Tartu", "Estonia"), ("Seville", "Spain"), ("Turin", "Italy"), ("Leipzig", "Germany"),
    ("Ghent", "Belgium"), ("Aarhus", "Denmark"), ("Tampere", "Finland"), ("Brno", "Czechia"),
    ("Cluj", "Romania"), ("Varna", "Bulgaria"), ("Izmir", "Turkey"), ("Haifa", "Israel"),
    ("Pune", "India"), ("Cebu", "Philippines"), ("Medan", "Indonesia"), ("Perth", "Australia"),
    ("Nelson", "New Zealand"), ("Calgary", "Canada"), ("Tucson", "United States"),
    ("Puebla", "Mexico"), ("Recife", "Brazil"), ("Rosario", "Argentina"), ("Cusco", "Peru"),
    ("Durban", "South Africa"), ("Kumasi", "Ghana"), ("Mombasa", "Kenya"), ("Fez", "Morocco"),
    ("Luxor", "Egypt"), ("Tabriz", "Iran"), ("Basra", "Iraq"), ("Chiang Mai", "Thailand"),
    ("Da Nang", "Vietnam"), ("Kandy", "Sri Lanka"), ("Malmö", "Sweden"),
]
MAX_WORDS = 4


SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def normalize(text: str) -> str:
    """Lower case, punctuation dropped, spaces collapsed, padded by one space a side (so
    `f" {name} " in normalize(text)` matches whole words only)."""
    return " " + " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split()) + " "


def names(text: str, name: str) -> bool:
    """Whether `text` names `name` as whole words, case and punctuation folded."""
    return normalize(name) in normalize(text)


class CountryEnv(ProblemEnv):
    """One question: the country of `city`, with a distractor sentence about another city."""

    def __init__(self, renderer: renderers.Renderer, city: str, country: str,
                 other_city: str, other_country: str, city_first: bool):
        super().__init__(renderer, convo_prefix=[{"role": "system", "content": SYSTEM}],
                         format_coef=0.1)
        self.city, self.country, self.other_country = city, country, other_country
        facts = [f"{city} is a city in {country}.", f"{other_city} is a city in {other_country}."]
        if not city_first:
            facts.reverse()
        self.question = (f"{' '.join(facts)}\nIn which country is {city}? "
                         "Answer with the country name only.")

    def get_question(self) -> str:
        return self.question

    def check_answer(self, sample_str: str) -> bool:
        return names(sample_str, self.country) and not names(sample_str, self.other_country)

    def check_format(self, sample_str: str) -> bool:
        return 0 < len(sample_str.split()) <= MAX_WORDS

    def get_reference_answer(self) -> str:
        return self.country


def questions(n: int, seed: int) -> list[tuple[str, str, str, str, bool]]:
    """`n` (city, country, other city, other country, city first) with distinct countries."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        (city, country), (other, other_country) = rng.sample(CITIES, 2)
        out.append((city, country, other, other_country, rng.random() < 0.5))
    return out


class CountriesDataset(RLDataset):
    """`n_batches` batches of `batch_size` groups; each group is `group_size` copies of one
    question, so the cookbook's group-centred advantages compare answers to the same prompt."""

    def __init__(self, model_name: str, renderer_name: str, batch_size: int, group_size: int,
                 n_batches: int, seed: int):
        self.renderer = renderers.get_renderer(renderer_name, get_tokenizer(model_name))
        self.batch_size, self.group_size, self.n_batches = batch_size, group_size, n_batches
        self.items = questions(batch_size * n_batches, seed)

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        chunk = self.items[index * self.batch_size:(index + 1) * self.batch_size]
        return [ProblemGroupBuilder(env_thunk=functools.partial(CountryEnv, self.renderer, *q),
                                    num_envs=self.group_size, dataset_name="countries")
                for q in chunk]

    def __len__(self) -> int:
        return self.n_batches


@chz.chz
class CountriesDatasetBuilder(RLDatasetBuilder):
    """The cookbook's `RLDatasetBuilder` of the countries task (training set only)."""

    model_name: str
    renderer_name: str
    batch_size: int = 4
    group_size: int = 4
    n_batches: int = 20
    seed: int = 0

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return CountriesDataset(self.model_name, self.renderer_name, self.batch_size,
                                self.group_size, self.n_batches, self.seed), None
