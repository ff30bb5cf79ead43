#!/bin/bash
# The reference solution (Harbor's oracle agent runs it in /app).
cat > /app/solution.py <<'PY'
def add(a, b):
    return a + b
PY
