---------------------------- MODULE KVTransfer ----------------------------
(***************************************************************************)
(* bulkhead's prefill/decode KV transfer protocol, written from its        *)
(* description (docs/verification.md, DESIGN.md section 2), independently  *)
(* of the Python transition functions in bulkhead/protocol/.               *)
(*                                                                         *)
(* Actors: one router, one prefill worker, one decode worker.  Requests    *)
(* are 1..N; a request's KV is modelled as its id, so a page's content is  *)
(* 0 (zero / scrubbed), a request id, or Garbage (corrupted on the wire),  *)
(* and a page digest is the content itself.                                *)
(*                                                                         *)
(* Network: control messages form a set that is never emptied, so any     *)
(* message may be delivered in any order, any number of times (reordering *)
(* and duplication for free; handlers must be idempotent).  The grant and *)
(* the manifest are per-request slots (one per request: no retries).      *)
(* Data-plane writes are a set of posted PageWrites (consumed when the    *)
(* decode transfer engine admits or refuses them) plus DMAs in flight     *)
(* (admitted, not yet landed: nothing can stop them).                     *)
(*                                                                         *)
(* Legacy = the incident: per-side limits (no router admission), a too-   *)
(* long prompt kept as a live 1-token stub with a pending rejection,      *)
(* decode trusting the sender's count, no generation check, pages freed   *)
(* at the outcome without drain and without scrub.                        *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS Legacy,      \* TRUE: the incident's protocol; FALSE: bulkhead's
          BlindDup,    \* TRUE: prefill's quiescence cannot see network duplicates
          FaultBudget  \* client aborts + duplicated/lost/corrupted writes, in all

\* ---- the bounded world ---------------------------------------------------
N == 3
Req == 1..N
Tenant == <<"B", "A", "A">>          \* r1 tenant B, r2 and r3 tenant A
Prompt == <<1, 2, 1>>                \* prompt pages (written by prefill)
Gen    == <<1, 1, 1>>                \* decode pages (written by decode)
Total(r) == Prompt[r] + Gen[r]
PrefillPool == 2                     \* pages
DecodePool  == 3
Context     == 8
Pages == 1..DecodePool
Min(S) == CHOOSE x \in S : \A y \in S : x <= y
\* one admission decision, against the smallest limit of the pair
Limit == Min({PrefillPool, DecodePool, Context})
\* legacy prefill's own input limit: min(context, pool) - 1 (the incident)
LegacyPrefillLimit == Min({Context, PrefillPool}) - 1

Garbage == N + 1
NoReq == 0
Outcomes == {"rejected", "finished", "aborted", "failed"}
NoMan == [ten |-> "none", cnt |-> 0, pages |-> <<>>, digs |-> <<>>]

Rev(s) == [i \in 1..Len(s) |-> s[Len(s) - i + 1]]
Range(s) == {s[i] : i \in DOMAIN s}

VARIABLES
  \* router
  rphase, rout,
  \* network
  ctl, grantMsg, manMsg, wire, dma, faults,
  \* prefill
  pphase, pstub, plocal, pout,
  \* decode: requests
  dphase, dpages, dgotman, dfailed, dacked, dout,
  \* decode: page ledger and memory
  owner, gen, wr, ldig, mem, free,
  \* observations (history)
  reads, moved

router  == <<rphase, rout>>
net     == <<ctl, grantMsg, manMsg, wire, dma, faults>>
prefill == <<pphase, pstub, plocal, pout>>
decreq  == <<dphase, dpages, dgotman, dfailed, dacked, dout>>
ledger  == <<owner, gen, wr, ldig, mem, free>>
hist    == <<reads, moved>>
vars == <<router, net, prefill, decreq, ledger, hist>>

Init ==
  /\ rphase = [r \in Req |-> "init"] /\ rout = [r \in Req |-> "none"]
  /\ ctl = {} /\ grantMsg = [r \in Req |-> <<>>] /\ manMsg = [r \in Req |-> NoMan]
  /\ wire = {} /\ dma = {} /\ faults = FaultBudget
  /\ pphase = [r \in Req |-> "none"] /\ pstub = [r \in Req |-> FALSE]
  /\ plocal = [r \in Req |-> 0] /\ pout = [r \in Req |-> "none"]
  /\ dphase = [r \in Req |-> "none"] /\ dpages = [r \in Req |-> <<>>]
  /\ dgotman = [r \in Req |-> FALSE] /\ dfailed = [r \in Req |-> FALSE]
  /\ dacked = [r \in Req |-> FALSE] /\ dout = [r \in Req |-> "none"]
  /\ owner = [p \in Pages |-> NoReq] /\ gen = [p \in Pages |-> 0]
  /\ wr = [p \in Pages |-> FALSE] /\ ldig = [p \in Pages |-> 0]
  /\ mem = [p \in Pages |-> 0]
  /\ free = [i \in 1..DecodePool |-> i]        \* a stack, top at the end
  /\ reads = {} /\ moved = {}

\* ---- router ---------------------------------------------------------------
Submit(r) ==
  /\ rphase[r] = "init"
  /\ IF ~Legacy /\ Total(r) > Limit
       THEN /\ rphase' = [rphase EXCEPT ![r] = "done"]     \* typed 4xx, nothing else
            /\ rout' = [rout EXCEPT ![r] = "rejected"]
            /\ UNCHANGED ctl
       ELSE /\ rphase' = [rphase EXCEPT ![r] = "live"]     \* ticket to both workers
            /\ UNCHANGED rout
            /\ ctl' = ctl \cup {[t |-> "assignP", r |-> r, o |-> "none"],
                                [t |-> "assignD", r |-> r, o |-> "none"]}
  /\ UNCHANGED <<grantMsg, manMsg, wire, dma, faults, prefill, decreq, ledger, hist>>

Decide(r, o) ==   \* the router alone decides the one outcome
  /\ rphase[r] = "live"
  /\ rphase' = [rphase EXCEPT ![r] = "done"]
  /\ rout' = [rout EXCEPT ![r] = o]
  /\ ctl' = ctl \cup {[t |-> "finP", r |-> r, o |-> o], [t |-> "finD", r |-> r, o |-> o]}

RouterDone(r) ==   \* decode's last output: the client's answer; a success is not finalized
  /\ [t |-> "decodeDone", r |-> r, o |-> "none"] \in ctl
  /\ rphase[r] = "live"
  /\ rphase' = [rphase EXCEPT ![r] = "done"]
  /\ rout' = [rout EXCEPT ![r] = "finished"]
  /\ UNCHANGED <<net, prefill, decreq, ledger, hist>>

RouterFailed(r) ==
  /\ [t |-> "failed", r |-> r, o |-> "none"] \in ctl
  /\ Decide(r, "failed")
  /\ UNCHANGED <<grantMsg, manMsg, wire, dma, faults, prefill, decreq, ledger, hist>>

ClientAbort(r) ==   \* at any point of a live request
  /\ faults > 0 /\ faults' = faults - 1
  /\ Decide(r, "aborted")
  /\ UNCHANGED <<grantMsg, manMsg, wire, dma, prefill, decreq, ledger, hist>>

\* ---- prefill --------------------------------------------------------------
PAssign(r) ==
  /\ [t |-> "assignP", r |-> r, o |-> "none"] \in ctl
  /\ pphase[r] = "none"
  /\ pphase' = [pphase EXCEPT ![r] = "waiting"]
  /\ IF Legacy /\ Prompt[r] > LegacyPrefillLimit
       THEN /\ pstub' = [pstub EXCEPT ![r] = TRUE]       \* pending flag, 1-token stub
            /\ pout' = [pout EXCEPT ![r] = "rejected"]   \* its 400 is dropped by the router
       ELSE UNCHANGED <<pstub, pout>>
  /\ UNCHANGED <<router, net, plocal, decreq, ledger, hist>>

PNeed(r) == IF pstub[r] THEN 1 ELSE Prompt[r]
PUsed == LET F[S \in SUBSET Req] == IF S = {} THEN 0
                                    ELSE LET x == CHOOSE x \in S : TRUE IN plocal[x] + F[S \ {x}]
         IN F[Req]

PCompute(r) ==   \* take local pages, compute the prompt's KV
  /\ pphase[r] = "waiting"
  /\ PrefillPool - PUsed >= PNeed(r)
  /\ pphase' = [pphase EXCEPT ![r] = "prefilling"]
  /\ plocal' = [plocal EXCEPT ![r] = PNeed(r)]
  /\ UNCHANGED <<router, net, pstub, pout, decreq, ledger, hist>>

PPost(r) ==      \* decode's grant is here: post one write per granted page, then the manifest
  /\ pphase[r] = "prefilling"
  /\ grantMsg[r] # <<>>
  /\ LET g == IF pstub[r] THEN SubSeq(grantMsg[r], 1, 1) ELSE grantMsg[r]
     IN /\ wire' = wire \cup {[r |-> r, page |-> g[i][1], gen |-> g[i][2], pay |-> r, dup |-> FALSE]
                               : i \in 1..Len(g)}
        /\ manMsg' = [manMsg EXCEPT ![r] =
              [ten |-> Tenant[r], cnt |-> PNeed(r),
               pages |-> [i \in 1..Len(g) |-> g[i][1]],
               digs |-> [i \in 1..Len(g) |-> r]]]
  /\ pphase' = [pphase EXCEPT ![r] = "transferring"]
  /\ UNCHANGED <<router, ctl, grantMsg, dma, faults, pstub, plocal, pout, decreq, ledger, hist>>

PFinalize(r) ==  \* never posts again
  /\ \E m \in ctl : m.t = "finP" /\ m.r = r /\
       /\ pphase[r] \notin {"draining", "done"}
       /\ pphase' = [pphase EXCEPT ![r] = "draining"]
       /\ pout' = [pout EXCEPT ![r] = IF pout[r] = "none" THEN m.o ELSE pout[r]]
  /\ UNCHANGED <<router, net, pstub, plocal, decreq, ledger, hist>>

\* Which of r's writes prefill can see outstanding.
Outstanding(r) == {w \in wire \cup dma : w.r = r /\ (BlindDup => ~w.dup)}

PQuiesce(r) ==   \* all my writes for r completed: free local pages, ack the drain
  /\ pphase[r] \in {"draining", "transferring"}   \* after the outcome, or as the writes end
  /\ Outstanding(r) = {}
  /\ pphase' = [pphase EXCEPT ![r] = "done"]
  /\ plocal' = [plocal EXCEPT ![r] = 0]
  /\ ctl' = ctl \cup {[t |-> "ack", r |-> r, o |-> "none"]}
  /\ UNCHANGED <<router, grantMsg, manMsg, wire, dma, faults, pstub, pout, decreq, ledger, hist>>

\* ---- decode ---------------------------------------------------------------
DAssign(r) ==
  /\ [t |-> "assignD", r |-> r, o |-> "none"] \in ctl
  /\ dphase[r] = "none"
  /\ dphase' = [dphase EXCEPT ![r] = "waiting"]
  /\ UNCHANGED <<router, net, prefill, dpages, dgotman, dfailed, dacked, dout, ledger, hist>>

DAllocate(r) ==  \* newest-freed first; generations bumped; grant with generations
  /\ dphase[r] = "waiting"
  /\ Len(free) >= Total(r)
  /\ LET k == Total(r)
         taken == Rev(SubSeq(free, Len(free) - k + 1, Len(free)))
     IN /\ free' = SubSeq(free, 1, Len(free) - k)
        /\ owner' = [p \in Pages |-> IF p \in Range(taken) THEN r ELSE owner[p]]
        /\ gen' = [p \in Pages |-> IF p \in Range(taken) THEN gen[p] + 1 ELSE gen[p]]
        /\ wr' = [p \in Pages |-> IF p \in Range(taken) THEN FALSE ELSE wr[p]]
        /\ dpages' = [dpages EXCEPT ![r] = taken]
        /\ grantMsg' = [grantMsg EXCEPT ![r] =
              [i \in 1..Prompt[r] |-> <<taken[i], gen[taken[i]] + 1>>]]
  /\ dphase' = [dphase EXCEPT ![r] = "alloc"]
  /\ UNCHANGED <<router, ctl, manMsg, wire, dma, faults, prefill, dgotman, dfailed, dacked, dout,
                 ldig, mem, hist>>

DAdmit(w) ==     \* the transfer engine admits a write against the page's current owner/generation
  /\ w \in wire
  /\ wire' = wire \ {w}
  /\ IF Legacy \/ (owner[w.page] = w.r /\ gen[w.page] = w.gen)
       THEN dma' = dma \cup {w}
       ELSE UNCHANGED dma                           \* stale: refused
  /\ UNCHANGED <<router, ctl, grantMsg, manMsg, faults, prefill, decreq, ledger, hist>>

DLand(w) ==      \* an admitted DMA lands, whatever the ledger says now
  /\ w \in dma
  /\ dma' = dma \ {w}
  /\ mem' = [mem EXCEPT ![w.page] = w.pay]
  /\ IF owner[w.page] = w.r /\ gen[w.page] = w.gen
       THEN /\ wr' = [wr EXCEPT ![w.page] = TRUE]
            /\ ldig' = [ldig EXCEPT ![w.page] = w.pay]
            /\ UNCHANGED moved
       ELSE /\ moved' = moved \cup {<<w.r, w.page, w.gen, owner[w.page], gen[w.page]>>}
            /\ UNCHANGED <<wr, ldig>>
  /\ UNCHANGED <<router, ctl, grantMsg, manMsg, wire, faults, prefill, decreq, owner, gen, free, reads>>

DManifest(r) ==
  /\ manMsg[r] # NoMan
  /\ dphase[r] = "alloc" /\ ~dgotman[r]
  /\ dgotman' = [dgotman EXCEPT ![r] = TRUE]
  /\ UNCHANGED <<router, net, prefill, dphase, dpages, dfailed, dacked, dout, ledger, hist>>

PromptPages(r) == SubSeq(dpages[r], 1, Prompt[r])

\* "ok", "wait" or "fail": exact coverage, every page written at its current generation, digests
Verdict(r) ==
  LET m == manMsg[r] IN
  IF Legacy THEN "ok"                               \* the sender's count is believed
  ELSE IF m.ten # Tenant[r] \/ m.cnt # Prompt[r] \/ m.pages # PromptPages(r)
          \/ Len(m.digs) # Len(m.pages) THEN "fail"
  ELSE IF \E i \in 1..Len(m.pages) : wr[m.pages[i]] /\ ldig[m.pages[i]] # m.digs[i] THEN "fail"
  ELSE IF \E i \in 1..Len(m.pages) : ~wr[m.pages[i]] THEN "wait"
  ELSE "ok"

DCommit(r) ==
  /\ dphase[r] = "alloc" /\ dgotman[r] /\ ~dfailed[r]
  /\ Verdict(r) = "ok"
  /\ dphase' = [dphase EXCEPT ![r] = "committed"]
  /\ UNCHANGED <<router, net, prefill, dpages, dgotman, dfailed, dacked, dout, ledger, hist>>

DFail(r) ==
  /\ dphase[r] = "alloc" /\ dgotman[r] /\ ~dfailed[r]
  /\ Verdict(r) = "fail"
  /\ dfailed' = [dfailed EXCEPT ![r] = TRUE]
  /\ ctl' = ctl \cup {[t |-> "failed", r |-> r, o |-> "none"]}
  /\ UNCHANGED <<router, grantMsg, manMsg, wire, dma, faults, prefill, dphase, dpages, dgotman,
                 dacked, dout, ledger, hist>>

DStep(r) ==      \* write generated tokens' KV into the decode pages, attend over every page
  /\ dphase[r] = "committed"
  /\ LET gp == {dpages[r][i] : i \in Prompt[r] + 1 .. Len(dpages[r])}
         m2 == [p \in Pages |-> IF p \in gp THEN r ELSE mem[p]]
     IN /\ mem' = m2
        /\ reads' = reads \cup {<<r, p, m2[p]>> : p \in Range(dpages[r])}
  /\ dphase' = [dphase EXCEPT ![r] = "decoding"]
  /\ UNCHANGED <<router, net, prefill, dpages, dgotman, dfailed,
                 dacked, dout, owner, gen, wr, ldig, free, moved>>

\* scrub on free (real only), push back so the same block is handed out next
Release(r) ==
  /\ free' = free \o Rev(dpages[r])
  /\ owner' = [p \in Pages |-> IF p \in Range(dpages[r]) THEN NoReq ELSE owner[p]]
  /\ wr' = [p \in Pages |-> IF p \in Range(dpages[r]) THEN FALSE ELSE wr[p]]
  /\ ldig' = [p \in Pages |-> IF p \in Range(dpages[r]) THEN 0 ELSE ldig[p]]
  /\ mem' = [p \in Pages |-> IF ~Legacy /\ p \in Range(dpages[r]) THEN 0 ELSE mem[p]]
  /\ dpages' = [dpages EXCEPT ![r] = <<>>]
  /\ dphase' = [dphase EXCEPT ![r] = "done"]
  /\ UNCHANGED gen

\* The last token (or an abort, which the engine ends at its next step):
\* the pages go at once, no drain wait, once no admitted DMA of r is
\* landing (the fence); decode's last output goes to the router.
DFinish(r) ==
  /\ \/ dphase[r] = "decoding"
     \/ dphase[r] = "committed" /\ dout[r] # "none"
  /\ ~\E w \in dma : w.r = r
  /\ Release(r)
  /\ ctl' = ctl \cup {[t |-> "decodeDone", r |-> r, o |-> "none"]}
  /\ UNCHANGED <<router, grantMsg, manMsg, wire, dma, faults, prefill, dgotman, dfailed, dacked,
                 dout, reads, moved>>

DFinalize(r) ==
  /\ \E m \in ctl : m.t = "finD" /\ m.r = r /\
       /\ dphase[r] \notin {"draining", "done"}
       /\ dout' = [dout EXCEPT ![r] = m.o]
       /\ IF dphase[r] \in {"committed", "decoding"}
            THEN UNCHANGED <<dphase, dpages, owner, gen, wr, ldig, mem, free>>  \* the engine's to end
          ELSE IF dpages[r] # <<>> /\ ~Legacy /\ ~dacked[r]
            THEN /\ dphase' = [dphase EXCEPT ![r] = "draining"]   \* a writer may still reach them
                 /\ UNCHANGED <<dpages, owner, gen, wr, ldig, mem, free>>
            ELSE Release(r)
  /\ UNCHANGED <<router, net, prefill, dgotman, dfailed, dacked, hist>>

DDrainAck(r) ==
  /\ [t |-> "ack", r |-> r, o |-> "none"] \in ctl
  /\ dphase[r] \notin {"none", "done"}
  /\ IF dphase[r] = "draining"
       THEN Release(r) /\ UNCHANGED dacked
       ELSE /\ ~dacked[r] /\ dacked' = [dacked EXCEPT ![r] = TRUE]
            /\ UNCHANGED <<dphase, dpages, owner, gen, wr, ldig, mem, free>>
  /\ UNCHANGED <<router, net, prefill, dgotman, dfailed, dout, hist>>

DLeaseExpired(r) ==   \* the fence: an admitted DMA never outlives the lease
  /\ dphase[r] = "draining"
  /\ ~\E w \in dma : w.r = r
  /\ Release(r)
  /\ UNCHANGED <<router, net, prefill, dgotman, dfailed, dacked, dout, hist>>

\* ---- environment faults on the data plane --------------------------------
Duplicate(w) ==
  /\ w \in wire /\ ~w.dup /\ faults > 0
  /\ faults' = faults - 1
  /\ wire' = wire \cup {[w EXCEPT !.dup = TRUE]}
  /\ UNCHANGED <<router, ctl, grantMsg, manMsg, dma, prefill, decreq, ledger, hist>>

Lose(w) ==
  /\ w \in wire /\ faults > 0
  /\ faults' = faults - 1
  /\ wire' = wire \ {w}
  /\ UNCHANGED <<router, ctl, grantMsg, manMsg, dma, prefill, decreq, ledger, hist>>

Corrupt(w) ==
  /\ w \in wire /\ w.pay # Garbage /\ faults > 0
  /\ faults' = faults - 1
  /\ wire' = (wire \ {w}) \cup {[w EXCEPT !.pay = Garbage]}
  /\ UNCHANGED <<router, ctl, grantMsg, manMsg, dma, prefill, decreq, ledger, hist>>

Next ==
  \/ \E r \in Req :
       \/ Submit(r) \/ RouterDone(r) \/ RouterFailed(r) \/ ClientAbort(r)
       \/ PAssign(r) \/ PCompute(r) \/ PPost(r) \/ PFinalize(r) \/ PQuiesce(r)
       \/ DAssign(r) \/ DAllocate(r) \/ DManifest(r) \/ DCommit(r) \/ DFail(r) \/ DStep(r) \/ DFinish(r)
       \/ DFinalize(r) \/ DDrainAck(r) \/ DLeaseExpired(r)
  \/ \E w \in wire : DAdmit(w) \/ Duplicate(w) \/ Lose(w) \/ Corrupt(w)
  \/ \E w \in dma : DLand(w)

Spec == Init /\ [][Next]_vars

\* ---- invariants -----------------------------------------------------------
TypeOK ==
  /\ rphase \in [Req -> {"init", "live", "done"}]
  /\ rout \in [Req -> Outcomes \cup {"none"}]
  /\ owner \in [Pages -> Req \cup {NoReq}]
  /\ mem \in [Pages -> 0..Garbage]
  /\ faults \in 0..FaultBudget

\* A decode read for r sees only r's KV, or zero: never another request's.
NoForeignRead == \A x \in reads : x[3] \in {x[1], 0}
\* ... and never another tenant's (garbage counts as foreign).
NoCrossTenantRead ==
  \A x \in reads : x[3] = 0 \/ (x[3] \in Req /\ Tenant[x[3]] = Tenant[x[1]])

\* committed(r) => the pages written for r are exactly the pages allocated to r.
CommitExact ==
  \A r \in Req : dphase[r] \in {"committed", "decoding"} =>
     /\ manMsg[r].pages = PromptPages(r)
     /\ \A i \in 1..Prompt[r] : wr[dpages[r][i]] /\ mem[dpages[r][i]] = r

\* rejected(r) => no ticket, page, write or token for r.
RejectedClean ==
  \A r \in Req : rout[r] = "rejected" =>
     /\ pphase[r] = "none" /\ dphase[r] = "none" /\ dpages[r] = <<>>
     /\ \A p \in Pages : owner[p] # r /\ mem[p] # r
     /\ \A m \in ctl : m.r # r
     /\ grantMsg[r] = <<>> /\ manMsg[r] = NoMan
     /\ \A w \in wire \cup dma : w.r # r
     /\ \A x \in reads : x[1] # r

\* No page is owned twice (by two requests, or by a request and the free stack).
NoDoubleOwner ==
  /\ Len(free) = Cardinality(Range(free))
  /\ \A p \in Pages : (p \in Range(free)) <=> (owner[p] = NoReq)
  /\ \A r \in Req : \A p \in Range(dpages[r]) : owner[p] = r
  /\ \A r1, r2 \in Req : r1 # r2 => Range(dpages[r1]) \cap Range(dpages[r2]) = {}

\* No write lands on a page whose owner or generation changed since it was granted.
NoWriteOnMovedPage == moved = {}

\* One terminal outcome: the router's, recorded as-is by both workers.
OneOutcome ==
  \A r \in Req : /\ pout[r] # "none" => pout[r] = rout[r]
                 /\ dout[r] # "none" => dout[r] = rout[r]

\* Data at rest: a free page holds no one's KV.
FreeScrubbed == \A i \in 1..Len(free) : mem[free[i]] = 0

\* The outcome, once decided, never changes (an action property).
OutcomeStable == [][\A r \in Req : rout[r] # "none" => rout'[r] = rout[r]]_vars
=============================================================================
