"""Lab 10's texts: the prompts speculative decoding is measured on, in one place. Three kinds: prose a draft
must guess, code (more predictable), and a repetitive document whose continuation repeats what the prompt holds
(what prompt lookup finds)."""

# the three kinds of text (one place): prose a draft must guess, code (more predictable), and a repetitive
# document whose continuation repeats what the prompt holds (what prompt lookup finds)
TEXTS = {
    "prose": (
        "The history of the lighthouse begins in the ancient world. Sailors needed a way to find the harbour at "
        "night, so fires were lit on hills near the coast. Later, towers were built to raise the light higher, "
        "and the most famous of them stood at Alexandria. Over the centuries"
    ),
    "code": (
        "def fibonacci(n):\n"
        '    """Return the n-th Fibonacci number."""\n'
        "    if n < 2:\n"
        "        return n\n"
        "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"
        "def factorial(n):\n"
        '    """Return n factorial."""\n'
        "    if n < 2:\n"
    ),
    "repetitive": (
        "Inventory report, shelf A: 12 red apples, 8 green pears, 5 yellow lemons, 3 orange melons.\n"
        "Inventory report, shelf B: 12 red apples, 8 green pears, 5 yellow lemons, 3 orange melons.\n"
        "Inventory report, shelf C: 12 red apples, 8 green pears, 5 yellow lemons, 3 orange melons.\n"
        "Inventory report, shelf D:"
    ),
}
