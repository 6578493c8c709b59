"""Tasks, prompts and tokenizers: reasoning_gym tasks are generated offline and reproducibly (and score);
GSM8K-format JSONL and parquet files load with their "####" answers reduced; bad keys, files and an
unreachable hub id are refused naming what is wrong; prompts render with the real SmolLM2 tokenizer
and the in-process tiny one; the sampler is deterministic and a resumed one continues with exactly the
original's batches (rewards: tests/test_rewards.py)."""
from __future__ import annotations

import json
import socket
import time

import pytest

from detent_rl.data import (DataError, PromptSampler, PromptTooLong, Task, config_digest, load_tasks, render_prompt,
                            split_eval)
from detent_rl.rewards import RewardError, gsm8k_numeric, reasoning_gym_score
from detent_rl.tokenizer import TINY_SPECIALS, TokenizerError, load_tokenizer, tiny_tokenizer

GSM8K_ROWS = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
               "altogether in April and May.\n#### 72"},
    {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
                 "How much did she earn?",
     "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned "
               "0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"},
    {"question": "A debt of 5 dollars grows by 9 dollars of spending. What is the balance?", "answer": "#### -14"},
    {"question": "How many grams are in 1,250 kilograms?", "answer": "1,250 x 1,000 = 1,250,000\n#### 1,250,000"},
]
REFERENCES = ["72", "10", "-14", "1,250,000"]


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: what runs under it is offline by construction."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- reasoning_gym ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gsm_symbolic", "basic_arithmetic"])
def test_reasoning_gym_tasks_are_deterministic_offline_and_scored(name, no_network):
    tasks = load_tasks(f"reasoning_gym:{name}", size=12, seed=3)
    assert tasks == load_tasks(f"reasoning_gym:{name}", size=12, seed=3)
    assert [t.id for t in tasks] == [f"reasoning_gym:{name}:3:{i}" for i in range(12)]
    assert load_tasks(f"reasoning_gym:{name}", size=20, seed=3)[:12] == tasks  # item i depends on (seed, i) only
    assert [t.question for t in load_tasks(f"reasoning_gym:{name}", size=12, seed=4)] != [t.question for t in tasks]
    for t in tasks:
        assert t.question and t.answer == t.answer.strip()
        assert gsm8k_numeric(f"Working... so the answer is {t.answer}.", t) == 1.0, t
        assert gsm8k_numeric(f"#### {int(t.answer) + 1}", t) == 0.0, t
        assert reasoning_gym_score(f"<answer>{t.answer}</answer>", t) == 1.0, t
        assert reasoning_gym_score(f"<answer>{int(t.answer) + 1}</answer>", t) < 1.0, t


def test_basic_arithmetic_has_negative_answers_that_score():
    negative = [t for t in load_tasks("reasoning_gym:basic_arithmetic", size=40, seed=0) if t.answer.startswith("-")]
    assert negative, "expected some negative basic_arithmetic answers"
    for t in negative:
        assert gsm8k_numeric(f"The answer is {t.answer}", t) == 1.0
        assert gsm8k_numeric(f"The answer is {t.answer[1:]}", t) == 0.0  # the sign matters


def test_reasoning_gym_task_config_changes_tasks_and_ids(no_network):
    easy = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
            "allow_parentheses": False, "allow_negation": False}
    tasks = load_tasks("reasoning_gym:basic_arithmetic", size=30, seed=0, task_config=easy)
    assert tasks == load_tasks("reasoning_gym:basic_arithmetic", size=30, seed=0, task_config=dict(easy))
    digest = config_digest(easy)
    assert digest == config_digest({**easy, "operators": ("+", "-")}) and len(digest) == 8
    assert [t.id for t in tasks] == [f"reasoning_gym:basic_arithmetic@{digest}:0:{i}" for i in range(30)]
    for t in tasks:  # two one-digit terms: "Calculate a + b." / "Calculate a - b."
        a, op, b = t.question.removeprefix("Calculate ").removesuffix(".").split()
        assert int(t.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))
        assert gsm8k_numeric(f"{t.question} #### {t.answer}", t) == 1.0
    with pytest.raises(RewardError, match="default task_config only"):
        reasoning_gym_score("<answer>1</answer>", tasks[0])
    with pytest.raises(DataError, match=r"task_config \{'max_term': 2\} is refused \(TypeError"):
        load_tasks("reasoning_gym:basic_arithmetic", size=2, seed=0, task_config={"max_term": 2})
    with pytest.raises(DataError, match=r"is refused \(AssertionError: max_terms must be >= min_terms"):
        load_tasks("reasoning_gym:basic_arithmetic", size=2, seed=0, task_config={"min_terms": 5, "max_terms": 2})
    with pytest.raises(DataError, match="task_config must not set size or seed"):
        load_tasks("reasoning_gym:basic_arithmetic", size=2, seed=0, task_config={"seed": 1})


def test_reasoning_gym_errors():
    with pytest.raises(DataError, match=r"no dataset 'gsm_symbolc'.*did you mean \['gsm_symbolic'"):
        load_tasks("reasoning_gym:gsm_symbolc", size=2, seed=0)
    with pytest.raises(DataError, match="split 'test' does not exist.*split_eval"):
        load_tasks("reasoning_gym:gsm_symbolic", split="test", size=2, seed=0)
    with pytest.raises(DataError, match="size must be a positive int, got 0"):
        load_tasks("reasoning_gym:gsm_symbolic", size=0, seed=0)
    with pytest.raises(RewardError, match="needs a task from a reasoning_gym:"):
        reasoning_gym_score("<answer>1</answer>", Task("data.jsonl:train:0", "q", "1"))


# --- local files and the hub -----------------------------------------------------------------------

def test_local_jsonl_loads_gsm8k_answers(tmp_path, no_network):
    path = _jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    tasks = load_tasks(str(path), size=100, seed=0)  # fewer rows than size: all of them
    assert [t.answer for t in tasks] == REFERENCES
    assert [t.question for t in tasks] == [r["question"] for r in GSM8K_ROWS]
    assert [t.id for t in tasks] == [f"{path}:train:{i}" for i in range(4)]
    assert load_tasks(str(path), size=2, seed=0) == tasks[:2]  # the first `size` rows, in file order
    for t, row in zip(tasks, GSM8K_ROWS):  # the dataset's own solution earns the reward
        assert gsm8k_numeric(row["answer"], t) == 1.0


def test_local_parquet_with_other_keys_and_numeric_answers(tmp_path, no_network):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "tasks.parquet"
    pq.write_table(pa.table({"problem": ["What is 6 * 7?", "What is 2 - 9?"], "solution": [42, -7],
                             "extra": ["a", "b"]}), path)
    tasks = load_tasks(str(path), question_key="problem", answer_key="solution", size=5, seed=0)
    assert tasks == [Task(f"{path}:train:0", "What is 6 * 7?", "42"), Task(f"{path}:train:1", "What is 2 - 9?", "-7")]


def test_local_file_errors_name_the_file_and_key(tmp_path, no_network):
    path = _jsonl(tmp_path / "qa.jsonl", [{"prompt": "q", "target": "1"}])
    with pytest.raises(DataError, match=r"qa\.jsonl: answer_key 'answer' is not a column; columns present: "
                                        r"\['prompt', 'target'\]"):
        load_tasks(str(path), question_key="prompt", size=1, seed=0)
    with pytest.raises(DataError, match=r"qa\.jsonl: question_key 'question' is not a column.*'prompt'"):
        load_tasks(str(path), size=1, seed=0)
    with pytest.raises(DataError, match=r"missing\.jsonl: task file does not exist"):
        load_tasks(str(tmp_path / "missing.jsonl"), size=1, seed=0)
    (tmp_path / "tasks.csv").write_text("question,answer\nq,1\n")
    with pytest.raises(DataError, match=r"tasks\.csv: unsupported task file type '\.csv'"):
        load_tasks(str(tmp_path / "tasks.csv"), size=1, seed=0)
    empty = _jsonl(tmp_path / "empty_answer.jsonl", [{"question": "q", "answer": "work\n#### "}])
    with pytest.raises(DataError, match=r"empty_answer\.jsonl: row 0 column 'answer' has an empty final answer"):
        load_tasks(str(empty), size=1, seed=0)
    with pytest.raises(DataError, match="split 'test' does not exist"):
        load_tasks(str(path), split="test", size=1, seed=0)
    with pytest.raises(DataError, match="subset applies only to a hub dataset"):
        load_tasks(str(path), subset="main", size=1, seed=0)
    with pytest.raises(DataError, match="task_config applies only to a reasoning_gym:<name> source"):
        load_tasks(str(path), task_config={"max_terms": 2}, size=1, seed=0)


def test_hub_id_fails_clearly_offline(monkeypatch):
    import datasets
    import huggingface_hub.constants

    # datasets reads these at import; the module attributes are what its loaders consult.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(DataError, match=r"detent-bogus/no-such-gsm8k: could not load split 'train' from the "
                                        r"Hugging Face Hub.*offline the hub is unreachable.*local \.jsonl"):
        load_tasks("detent-bogus/no-such-gsm8k", size=4, seed=0)
    with pytest.raises(DataError, match=r"detent-bogus/gsm8k: could not load split 'test' from the Hugging Face"):
        load_tasks("detent-bogus/gsm8k", subset="main", split="test", size=4, seed=0)
    assert time.monotonic() - start < 30, "offline hub failure should be immediate, not retried"


# --- tokenizers and prompts ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    from detent_rl.models.gguf import ModelFetchError, smollm2_checkpoint

    try:
        path = smollm2_checkpoint()
    except ModelFetchError as e:
        pytest.skip(f"SmolLM2 checkpoint unavailable: {e}")
    if not path.is_dir():
        pytest.skip(f"SmolLM2 checkpoint directory {path} is absent")
    return load_tokenizer(path)


def test_render_prompt_with_smollm2(smollm2):
    tok = smollm2
    task = Task("t:0", "What is 6 times 7?", "42")
    assert tok.vocab_size == 49152
    assert tok.eos_token_ids[0] == tok.hf.convert_tokens_to_ids("<|im_end|>")
    suffix = "\nPut the final answer after ####."
    ids = render_prompt(task, tok, template="chat", system_prompt="Be brief.", suffix=suffix, max_prompt_tokens=256)
    assert tok.decode(ids, skip_special_tokens=False) == (
        f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{task.question}{suffix}<|im_end|>\n"
        f"<|im_start|>assistant\n")
    default = tok.decode(render_prompt(task, tok, template="chat", system_prompt=None, suffix="",
                                       max_prompt_tokens=256), skip_special_tokens=False)
    assert "SmolLM" in default and default.endswith(f"user\n{task.question}<|im_end|>\n<|im_start|>assistant\n")
    plain = render_prompt(task, tok, template="plain", system_prompt=None, suffix="", max_prompt_tokens=256)
    assert tok.decode(plain) == f"Question: {task.question}\nAnswer:"
    assert plain == tok.encode(f"Question: {task.question}\nAnswer:")
    with pytest.raises(PromptTooLong, match=r"task t:0: prompt is \d+ tokens, over max_prompt_tokens=8"):
        render_prompt(task, tok, template="chat", system_prompt=None, suffix="", max_prompt_tokens=8)


def test_tiny_tokenizer_round_trips_and_templates():
    tok = tiny_tokenizer(300)
    assert tok.vocab_size == 259
    text = "Héllo, wörld! 12,345 − 7 = ?\n\t日本語 🙂"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))  # token id b < 256 is the byte b
    assert tok.decode(ids) == text
    specials = [tok.hf.convert_tokens_to_ids(s) for s in TINY_SPECIALS]
    assert specials == [256, 257, 258]
    assert tok.eos_token_ids == (258, 256)  # <|im_end|> (end of turn), <|endoftext|>
    assert tok.encode("a<|im_end|>b") == [97, 258, 98]
    assert tok.decode([97, 258, 98]) == "ab" and tok.decode([97, 258, 98], skip_special_tokens=False) == "a<|im_end|>b"
    assert tok.decode([97, 299, 98]) == "ab"  # ids of a larger model vocabulary decode to nothing

    task = Task("t:1", "What is 2 + 2?", "4")
    ids = render_prompt(task, tok, template="chat", system_prompt="sys", suffix=" Think.", max_prompt_tokens=512)
    assert tok.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nWhat is 2 + 2? Think.<|im_end|>\n<|im_start|>assistant\n")
    assert "What is 2 + 2?" in tok.decode(ids)
    plain = render_prompt(task, tok, template="plain", system_prompt="sys", suffix="", max_prompt_tokens=512)
    assert tok.decode(plain) == "sys\n\nQuestion: What is 2 + 2?\nAnswer:"
    with pytest.raises(DataError, match=r"task t:1: prompt template 'raw' is not one of \['chat', 'plain'\]"):
        render_prompt(task, tok, template="raw", system_prompt=None, suffix="", max_prompt_tokens=512)
    with pytest.raises(TokenizerError, match="vocab_size must be an int >= 259"):
        tiny_tokenizer(258)


def test_load_tokenizer_errors_name_the_directory(tmp_path):
    with pytest.raises(TokenizerError, match=f"{tmp_path / 'nope'}: tokenizer directory does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(TokenizerError, match=f"{tmp_path}: no tokenizer.json or tokenizer_config.json"):
        load_tokenizer(tmp_path)


# --- splitting and sampling ------------------------------------------------------------------------

TASKS = [Task(f"src:train:{i}", f"question {i}", str(i)) for i in range(23)]


def test_split_eval_is_deterministic_and_disjoint():
    train, held = split_eval(TASKS, 5)
    assert len(held) == 5 and len(train) == 18
    assert sorted(train + held, key=TASKS.index) == TASKS
    assert split_eval(TASKS, 5) == (train, held)
    assert set(split_eval(TASKS[::-1], 5)[1]) == set(held)  # chosen by id, not position
    assert split_eval(TASKS, 0) == (TASKS, [])
    with pytest.raises(DataError, match=r"eval_size must be an int in \[0, 23\)"):
        split_eval(TASKS, 23)
    with pytest.raises(DataError, match="task id 'src:train:0' appears twice"):
        split_eval(TASKS + TASKS[:1], 1)


def _batches(sampler: PromptSampler, n: int) -> list[list[str]]:
    return [[t.id for t in sampler.next_batch()] for _ in range(n)]


def test_prompt_sampler_is_deterministic_and_covers_each_epoch():
    batches = _batches(PromptSampler(TASKS, 4, seed=7), 15)
    assert batches == _batches(PromptSampler(TASKS, 4, seed=7), 15)
    assert batches != _batches(PromptSampler(TASKS, 4, seed=8), 15)
    per_epoch = len(TASKS) // 4  # 5 batches; 3 tasks dropped per epoch
    for e in range(3):
        epoch = [i for b in batches[e * per_epoch:(e + 1) * per_epoch] for i in b]
        assert len(epoch) == len(set(epoch)) == 20
    assert batches[:per_epoch] != batches[per_epoch:2 * per_epoch]  # a fresh shuffle per epoch
    with pytest.raises(DataError, match=r"prompts_per_step must be an int in \[1, 23\]"):
        PromptSampler(TASKS, 24, seed=0)


@pytest.mark.parametrize("steps_before", [0, 3, 5, 7, 11])
def test_prompt_sampler_resumes_exactly(steps_before):
    original = PromptSampler(TASKS, 4, seed=7)
    _batches(original, steps_before)
    state = json.loads(json.dumps(original.state_dict()))  # a checkpoint stores it as JSON
    resumed = PromptSampler(TASKS, 4, seed=7)
    resumed.load_state_dict(state)
    expected = _batches(original, 12)
    assert _batches(resumed, 12) == expected
    if steps_before:  # negative control: without the state the batches differ
        assert _batches(PromptSampler(TASKS, 4, seed=7), 12) != expected


def test_prompt_sampler_refuses_a_foreign_state():
    state = PromptSampler(TASKS, 4, seed=7).state_dict()
    with pytest.raises(DataError, match="sampler state: seed is 7, this sampler has 8"):
        PromptSampler(TASKS, 4, seed=8).load_state_dict(state)
    with pytest.raises(DataError, match="sampler state: tasks_digest"):
        PromptSampler(TASKS[::-1], 4, seed=7).load_state_dict(state)
    with pytest.raises(DataError, match=r"sampler state: position must be an int in \[0, 23\], got 99"):
        PromptSampler(TASKS, 4, seed=7).load_state_dict(dict(state, position=99))
