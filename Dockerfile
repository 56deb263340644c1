# One image, both services: `pinlog-ai` (the AI worker, default command) and `pinlog-core`.
# Runtime dependencies are pinned by requirements/runtime.txt (pip-compile of pyproject.toml);
# the development extras (embedded PostgreSQL) and the demo are not in the image.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Current pip and setuptools in the venv the runtime stage copies (the venv's own are old).
COPY requirements/build-tools.txt requirements/build-tools.txt
RUN pip install --upgrade -r requirements/build-tools.txt
# Dependencies first: this layer is rebuilt only when the lock file changes.
COPY requirements/runtime.txt requirements/runtime.txt
RUN pip install -r requirements/runtime.txt
COPY pyproject.toml README.md ./
COPY app app
COPY core_service core_service
COPY pinlog_platform pinlog_platform
# --no-deps: everything the package needs is already installed from the lock file.
RUN pip install --no-deps . && pip check

FROM python:${PYTHON_VERSION}-slim AS runtime
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin pinlog
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER pinlog
EXPOSE 8000
# Liveness of whichever service the container runs: both serve GET /healthz on port 8000.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["pinlog-ai", "serve", "--host", "0.0.0.0", "--port", "8000"]
