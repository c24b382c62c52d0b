#!/usr/bin/env bash
# Old stack (Py 3.11, JAX 0.10.2) vs new (Py 3.12, JAX 0.11.2), same code, same machine,
# alternating per benchmark. Writes JSONL per stack into /work/ab/.
cd /work/main
export GLIBC_TUNABLES=glibc.malloc.hugetlb=1
for rep in 1 2; do
for stack in old new; do
  py=/work/venvs/$stack/bin/python
  $py -m rhnzoo.bench.rnn --cells=lstm,gru --configs=pmnist,imdb_cpu --rounds=9 \
     >> /work/ab/rnn_$stack.jsonl 2>> /work/ab/rnn_$stack.log
done
done
for stack in old new; do
  py=/work/venvs/$stack/bin/python
  $py -m rhnzoo.bench.lm --configs=ptb_sota --steps=30 --budget_s=150 --eval_tokens=0 \
     >> /work/ab/lm_$stack.jsonl 2>> /work/ab/lm_$stack.log
done
for stack in old new; do
  py=/work/venvs/$stack/bin/python
  $py -m rhnzoo.bench.lm --configs=ptb_d40_hsg --steps=10 --budget_s=90 --eval_tokens=0 \
     >> /work/ab/lm_$stack.jsonl 2>> /work/ab/lm_$stack.log
done
echo BENCHDONE
