"""An ordinary agent on the openai SDK, with nothing salvor-specific in it.

It reads its task from SALVOR_PROMPT (falling back to its arguments), asks
the model, runs the one tool the model may call (a local invoice lookup), and
prints the model's final answer. salvor makes it durable from the outside:
it starts this script with OPENAI_BASE_URL pointed at its loopback proxy, so
every model call is recorded, answered from the log after a crash, and
re-runnable with zero model calls.
"""

import json
import os
import sys

import openai

INVOICES = {
    "INV-1001": {"amount": 120.0, "status": "paid twice"},
    "INV-2002": {"amount": 75.5, "status": "open"},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_invoice",
            "description": "Look up an invoice by id: its amount and status.",
            "parameters": {
                "type": "object",
                "properties": {"invoice_id": {"type": "string"}},
                "required": ["invoice_id"],
            },
        },
    }
]


def lookup_invoice(invoice_id: str) -> dict:
    return INVOICES.get(invoice_id, {"error": f"no invoice {invoice_id}"})


def main() -> None:
    task = os.environ.get("SALVOR_PROMPT") or " ".join(sys.argv[1:]) or "Is INV-1001 settled?"
    client = openai.OpenAI()
    model = os.environ.get("AGENT_MODEL", "gpt-4o-mini")
    messages = [
        {
            "role": "system",
            "content": "You answer billing questions. Look invoices up before answering.",
        },
        {"role": "user", "content": task},
    ]
    while True:
        message = (
            client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
            .choices[0]
            .message
        )
        if not message.tool_calls:
            print(message.content)
            return
        messages.append(
            {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in message.tool_calls
                ],
            }
        )
        for call in message.tool_calls:
            result = lookup_invoice(**json.loads(call.function.arguments or "{}"))
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}
            )


if __name__ == "__main__":
    main()
