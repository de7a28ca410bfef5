"""How every bench script prints its one result: a JSON object with --json, else one aligned `key: value` line each."""

import json


def print_result(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}: {value}")
