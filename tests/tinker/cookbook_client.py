"""Run a tinker-cookbook training loop against a Tinker server: this file runs under
.venv-tinker's interpreter (the cookbook's own environment, transformers 5.5.4), never under
traingym's, and imports no traingym. `python cookbook_client.py MODE CONFIG_JSON`.

MODE `sl_train`: the cookbook's supervised trainer (`tinker_cookbook.supervised.train`, the loop
recipes/sl_basic.py runs), built through its documented Python API (`train.Config(...)`,
`asyncio.run(train.main(config))`, as its docstring shows) with a local JSONL dataset
(`FromConversationFileBuilder`, the dataset sl_basic.py documents for "your own dataset").
Its own command line cannot be used: `python -m tinker_cookbook.supervised.train` fails in 0.5.8
("Nested entrypoints must take a type annotated argument"), and sl_basic.py's looks the model
name up in the cookbook's model table (only hub models such as Qwen/Qwen3-8B).

MODE `sl_loop`: recipes/sl_loop.py's `main` unchanged, with its two lookups that need the
network or a hub model name replaced: `datasets.load_dataset("HuggingFaceH4/no_robots")` reads the
local JSONL instead, and `model_info.get_recommended_renderer_name` answers CONFIG's renderer
(the recipe has no option for either). Everything it sends to the server is the recipe's own.

MODE `tokenizer`: the SDK's get_tokenizer() for each served model (get_info's tokenizer_id).

CONFIG's model_name is a served local model folder: the cookbook loads the tokenizer from the
model name (`get_tokenizer(model_name)`, a local folder when it is one), so it must be a path.
"""

import asyncio
import json
import sys


def sl_train(c: dict) -> None:
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=c["model_name"], renderer_name=c["renderer_name"],
        max_length=c["max_length"], batch_size=c["batch_size"])
    config = train.Config(
        log_path=c["log_path"], model_name=c["model_name"], recipe_name="traingym_test",
        renderer_name=c["renderer_name"], base_url=c["base_url"],
        dataset_builder=FromConversationFileBuilder(common_config=common,
                                                    file_path=c["dataset"],
                                                    test_size=c.get("test_size", 0)),
        learning_rate=c["learning_rate"], lora_rank=c["lora_rank"], max_steps=c["steps"],
        eval_every=c.get("eval_every", 0), save_every=0, num_epochs=c.get("num_epochs", 1))
    asyncio.run(train.main(config))


def sl_loop(c: dict) -> None:
    import datasets
    from tinker_cookbook import model_info
    from tinker_cookbook.recipes import sl_loop as recipe

    hub_load = datasets.load_dataset

    def load_dataset(name, *args, **kwargs):
        assert name == "HuggingFaceH4/no_robots", name
        return hub_load("json", data_files={"train": c["dataset"]})

    recipe.datasets.load_dataset = load_dataset
    model_info.get_recommended_renderer_name = lambda name: c["renderer_name"]
    recipe.main(recipe.Config(
        base_url=c["base_url"], log_path=c["log_path"], model_name=c["model_name"],
        batch_size=c["batch_size"], learning_rate=c["learning_rate"],
        max_length=c["max_length"], lora_rank=c["lora_rank"], save_every=0,
        max_steps=c["steps"]))


def tokenizer(c: dict) -> None:
    """Print, per base model, how the SDK's `TrainingClient.get_tokenizer()` (get_info's
    tokenizer_id, loaded with this environment's transformers) encodes c["text"]."""
    import tinker

    service = tinker.ServiceClient(base_url=c["base_url"])
    out = {}
    for name in c["models"]:
        tok = service.create_lora_training_client(base_model=name, rank=4).get_tokenizer()
        out[name] = tok.encode(c["text"], add_special_tokens=False)
    service.close("success").result()
    print("TOKENS " + json.dumps(out))


if __name__ == "__main__":
    run = {"sl_train": sl_train, "sl_loop": sl_loop, "tokenizer": tokenizer}[sys.argv[1]]
    run(json.loads(sys.argv[2]))
