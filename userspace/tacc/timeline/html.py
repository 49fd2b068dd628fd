# ruff: noqa: E501  (inline JS/CSS of the offline view)
"""Self-contained offline HTML view: one file, inline JS/CSS, no network.

Keeps at most ``max_slices`` slices (the first ones of each batch past the limit are
dropped and counted) and decimates counter series to ``max_points`` per track, so the
file stays small whatever the capture's length.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

import numpy as np

from .model import Batch, CounterBatch, Track


class HtmlSink:
    def __init__(self, max_slices: int = 300_000, max_points: int = 4000) -> None:
        self.max_slices = max_slices
        self.max_points = max_points
        self.slices_parts: list[np.ndarray] = []
        self.n = 0
        self.dropped = 0
        self.counters_data: dict[int, list[np.ndarray]] = {}
        self.findings: list[dict[str, Any]] = []
        # tacc.analyze.report's roofline and step breakdown (version-3 captures only;
        # empty: the view is what it was without them)
        self.report: dict[str, Any] = {}

    def slices(self, b: Batch) -> None:
        room = self.max_slices - self.n
        n = len(b)
        if room <= 0:
            self.dropped += n
            return
        k = min(room, n)
        if k < n:
            self.dropped += n - k
        dur = b.dur if b.dur is not None else np.full(n, -1, np.int64)
        flow = b.flow if b.flow is not None else np.zeros(n, np.uint64)
        rows = np.stack([b.track[:k].astype(np.int64), b.ts[:k], dur[:k], b.name[:k],
                         (flow[:k] & np.uint64(0xFFFFFFFFFFFFF)).astype(np.int64)], axis=1)
        self.slices_parts.append(rows)
        self.n += k

    def counters(self, c: CounterBatch) -> None:
        for t in np.unique(c.track).tolist():
            m = c.track == t
            parts = self.counters_data.setdefault(t, [])
            parts.append(np.stack([c.ts[m].astype(np.float64), c.value[m]], axis=1))
            total = sum(len(p) for p in parts)
            if total > 2 * self.max_points:
                allp = np.concatenate(parts)
                step = max(len(allp) // self.max_points, 1)
                # keep the max of each group (peaks stay visible)
                g = len(allp) // step
                v = allp[: g * step, 1].reshape(g, step)
                ts = allp[: g * step: step, 0]
                parts[:] = [np.stack([ts, v.max(axis=1)], axis=1)]

    def write(self, out: TextIO, tracks: list[Track], names: list[str],
              metadata: dict[str, Any], title: str) -> None:
        sl = np.concatenate(self.slices_parts) if self.slices_parts else np.zeros((0, 5), np.int64)
        t0 = int(sl[:, 1].min()) if len(sl) else 0
        t1 = int((sl[:, 1] + np.maximum(sl[:, 2], 0)).max()) if len(sl) else 1
        for parts in self.counters_data.values():
            for p in parts:
                if len(p):
                    t0 = min(t0, int(p[:, 0].min()))
                    t1 = max(t1, int(p[:, 0].max()))
        for f in self.findings:
            for a, b in f.get("time_ranges", []):
                t0, t1 = min(t0, int(a)), max(t1, int(b))
        o = np.lexsort((sl[:, 1], sl[:, 0])) if len(sl) else np.zeros(0, np.int64)
        sl = sl[o]
        rel = sl.copy()
        rel[:, 1] -= t0
        counters = {}
        for t, parts in self.counters_data.items():
            p = np.concatenate(parts) if parts else np.zeros((0, 2))
            counters[str(t)] = [[round(float(a) - t0), round(float(v), 4)] for a, v in p.tolist()]
        data = {
            "title": title,
            "t0": t0, "span": max(t1 - t0, 1),
            "tracks": [{"id": t.idx, "name": t.name, "parent": t.parent, "kind": t.kind,
                        "unit": t.unit,
                        **({"os": t.os_kind, "pid": t.pid, "tid": t.tid, "comm": t.os_name}
                           if t.os_kind else {})} for t in tracks],
            "names": names,
            "slices": rel.tolist(),
            "counters": counters,
            "findings": [{"rule": f["rule"], "severity": f["severity"],
                          "title": f.get("title", f["rule"]),
                          "suggestion": f.get("suggestion", ""),
                          "ranges": [[int(a) - t0, int(b) - t0] for a, b in f["time_ranges"]]}
                         for f in self.findings],
            "dropped": self.dropped,
            "meta": metadata,
        }
        if self.report:
            data["report"] = self.report
        payload = json.dumps(data, separators=(",", ":"), default=str).replace("</", "<\\/")
        page = TEMPLATE.replace("__REPORT_BUTTON__", REPORT_BUTTON if self.report else "")
        page = page.replace("__REPORT_SCRIPT__", REPORT_SCRIPT if self.report else "")
        out.write(page.replace("__TITLE__", _esc(title)).replace("__DATA__", payload))


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


TEMPLATE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>__TITLE__</title>
<style>
html,body{margin:0;height:100%;font:12px system-ui,sans-serif;background:#fafafa;color:#222}
#bar{height:30px;display:flex;align-items:center;gap:12px;padding:0 8px;background:#263238;color:#eee}
#bar button{font:inherit}
#main{position:absolute;top:30px;bottom:0;left:0;right:0;overflow-y:auto;overflow-x:hidden}
#wrap{position:relative}
#labels{position:absolute;left:0;top:0;width:260px;background:#fff;border-right:1px solid #ccc}
.lab{position:absolute;left:0;width:256px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;padding-left:4px;box-sizing:border-box;border-bottom:1px solid #eee}
.grp{font-weight:bold;background:#eceff1}
#cv{position:absolute;left:260px;top:0}
#tip{position:fixed;pointer-events:none;background:#fffde7;border:1px solid #999;padding:4px;display:none;max-width:480px;white-space:pre-wrap;z-index:5}
</style></head><body>
<div id="bar"><b id="ttl"></b><span id="rng"></span>
<label><input type="checkbox" id="flows" checked> flows</label>
<button id="reset">reset zoom</button>__REPORT_BUTTON__<span id="note"></span>
<span style="margin-left:auto">wheel: zoom &middot; drag: pan &middot; w/s/a/d</span></div>
<div id="main"><div id="wrap"><div id="labels"></div><canvas id="cv"></canvas></div></div>
<div id="tip"></div>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
(function(){
const D=JSON.parse(document.getElementById("data").textContent);
document.getElementById("ttl").textContent=D.title;
if(D.dropped>0)document.getElementById("note").textContent="("+D.dropped+" slices beyond the view's limit not shown)";
const tracks=D.tracks, byId={};tracks.forEach(t=>{byId[t.id]=t;t.children=[];t.sl=null;});
tracks.forEach(t=>{if(t.parent!==null&&byId[t.parent])byId[t.parent].children.push(t);});
// slices per track: arrays sorted by ts
const per={};for(const s of D.slices){(per[s[0]]=per[s[0]]||[]).push(s);}
for(const k in per){const a=per[k];let m=0;a.forEach(s=>{m=Math.max(m,s[1]+Math.max(s[2],0));s.push(m);});}
// findings become a group with one row per rule
let fid=-1;const fgroup={id:fid--,name:"findings",kind:"group",children:[],parent:null};
const frules={};for(const f of D.findings){if(!frules[f.rule]){const t={id:fid--,name:"finding: "+f.rule,kind:"finding",children:[],items:[]};frules[f.rule]=t;fgroup.children.push(t);}frules[f.rule].items.push(f);}
const rows=[];let y=0;
function lay(t,depth){const h=t.kind==="group"?18:(t.kind==="counter"?40:20);
 const has=t.kind==="group"?true:(t.kind==="counter"?!!D.counters[t.id]:(t.kind==="finding"||!!per[t.id]));
 if(!has)return;rows.push({t,y,h,depth});y+=h;for(const c of t.children)lay(c,depth+1);}
if(D.findings.length)lay(fgroup,0);
tracks.filter(t=>t.parent===null).forEach(t=>lay(t,0));
const labels=document.getElementById("labels"),cv=document.getElementById("cv"),ctx=cv.getContext("2d");
const wrap=document.getElementById("wrap");wrap.style.height=y+"px";labels.style.height=y+"px";
for(const r of rows){const d=document.createElement("div");d.className="lab"+(r.t.kind==="group"?" grp":"");
 d.style.top=r.y+"px";d.style.height=r.h+"px";d.style.lineHeight=r.h+"px";d.style.paddingLeft=(4+10*r.depth)+"px";
 d.textContent=r.t.name+(r.t.unit?" ["+r.t.unit+"]":"");d.title=d.textContent;d.dataset.track=r.t.name;labels.appendChild(d);}
let v0=0,v1=D.span;
function W(){return Math.max(100,window.innerWidth-260-18);}
function X(t){return (t-v0)/(v1-v0)*W();}
function col(i){const h=(i*137.508)%360;return "hsl("+h+",55%,62%)";}
function lb(a,t){let lo=0,hi=a.length;while(lo<hi){const m=(lo+hi)>>1;if(a[m][5]<t)lo=m+1;else hi=m;}return lo;}
function fmt(ns){const a=Math.abs(ns);if(a>=1e9)return (ns/1e9).toFixed(3)+" s";if(a>=1e6)return (ns/1e6).toFixed(3)+" ms";if(a>=1e3)return (ns/1e3).toFixed(1)+" us";return ns.toFixed(0)+" ns";}
const pos={};
function draw(){const w=W(),dpr=window.devicePixelRatio||1;cv.width=w*dpr;cv.height=y*dpr;cv.style.width=w+"px";cv.style.height=y+"px";
 ctx.setTransform(dpr,0,0,dpr,0,0);ctx.clearRect(0,0,w,y);ctx.font="11px sans-serif";
 document.getElementById("rng").textContent=fmt(v0)+" .. "+fmt(v1)+" (span "+fmt(v1-v0)+")";
 for(const k in pos)delete pos[k];
 for(const r of rows){const t=r.t;ctx.fillStyle=r.t.kind==="group"?"#eceff1":"#fff";ctx.fillRect(0,r.y,w,r.h);
  ctx.strokeStyle="#eee";ctx.beginPath();ctx.moveTo(0,r.y+r.h-.5);ctx.lineTo(w,r.y+r.h-.5);ctx.stroke();
  if(t.kind==="slice"&&per[t.id]){const a=per[t.id];let lastx=-1;
   for(let i=lb(a,v0);i<a.length&&a[i][1]<=v1;i++){const s=a[i];let x0=X(s[1]),x1=s[2]>=0?X(s[1]+s[2]):x0+2;
    if(x1<lastx+0.5&&x1-x0<1)continue;lastx=x1;ctx.fillStyle=col(s[3]);
    if(s[2]<0){ctx.beginPath();ctx.moveTo(x0,r.y+3);ctx.lineTo(x0+4,r.y+r.h-3);ctx.lineTo(x0-4,r.y+r.h-3);ctx.fill();}
    else{ctx.fillRect(x0,r.y+2,Math.max(x1-x0,1),r.h-4);
     if(x1-x0>30){ctx.fillStyle="#000";ctx.save();ctx.beginPath();ctx.rect(x0,r.y,x1-x0,r.h);ctx.clip();ctx.fillText(D.names[s[3]]||"",x0+2,r.y+14);ctx.restore();}}
    if(s[4]){(pos[s[4]]=pos[s[4]]||[]).push([s[1],x0,r.y+r.h/2]);}}}
  if(t.kind==="counter"&&D.counters[t.id]){const a=D.counters[t.id];let mx=0;a.forEach(p=>{if(p[1]>mx)mx=p[1];});mx=mx||1;
   ctx.strokeStyle="#1565c0";ctx.fillStyle="rgba(21,101,192,.15)";ctx.beginPath();let st=false,lx=0;
   for(const p of a){const x=X(p[0]);if(x<-50||x>w+50)continue;const yy=r.y+r.h-2-(p[1]/mx)*(r.h-6);if(!st){ctx.moveTo(x,yy);st=true;}else{ctx.lineTo(x,yy);}lx=x;}
   ctx.stroke();ctx.fillStyle="#555";ctx.fillText("max "+mx.toPrecision(4),4,r.y+11);}
  if(t.kind==="finding"){for(const f of t.items)for(const g of f.ranges){const x0=X(g[0]),x1=X(g[1]);if(x1<0||x0>w)continue;
   ctx.fillStyle=f.severity==="high"?"#e53935":(f.severity==="medium"?"#fb8c00":"#fdd835");ctx.fillRect(x0,r.y+2,Math.max(x1-x0,2),r.h-4);}}}
 if(document.getElementById("flows").checked){ctx.strokeStyle="rgba(80,80,80,.7)";ctx.lineWidth=1;
  let n=0;for(const k in pos){const a=pos[k];if(a.length<2)continue;a.sort((p,q)=>p[0]-q[0]);
   for(let i=1;i<a.length&&n<20000;i++,n++){ctx.beginPath();ctx.moveTo(a[i-1][1],a[i-1][2]);ctx.lineTo(a[i][1],a[i][2]);ctx.stroke();
    ctx.beginPath();ctx.arc(a[i][1],a[i][2],2,0,6.3);ctx.fill();}}}
 document.body.dataset.rendered=String(rows.length);}
function zoom(f,cx){const t=v0+(v1-v0)*cx/W();v0=t-(t-v0)*f;v1=t+(v1-t)*f;if(v1-v0<100){const m=(v0+v1)/2;v0=m-50;v1=m+50;}draw();}
cv.addEventListener("wheel",e=>{e.preventDefault();zoom(e.deltaY>0?1.25:0.8,e.offsetX);},{passive:false});
let drag=null;cv.addEventListener("mousedown",e=>{drag=[e.clientX,v0,v1];});
window.addEventListener("mouseup",()=>{drag=null;});
window.addEventListener("mousemove",e=>{if(drag){const d=(e.clientX-drag[0])/W()*(drag[2]-drag[1]);v0=drag[1]-d;v1=drag[2]-d;draw();return;}tip(e);});
window.addEventListener("keydown",e=>{const k=e.key;if(k==="w")zoom(0.8,W()/2);else if(k==="s")zoom(1.25,W()/2);
 else if(k==="a"||k==="d"){const d=(v1-v0)*0.1*(k==="a"?-1:1);v0+=d;v1+=d;draw();}});
document.getElementById("reset").onclick=()=>{v0=0;v1=D.span;draw();};
document.getElementById("flows").onchange=draw;
const tipd=document.getElementById("tip");
function tip(e){const b=cv.getBoundingClientRect();const x=e.clientX-b.left,yy=e.clientY-b.top;
 if(x<0||yy<0||x>b.width||yy>b.height){tipd.style.display="none";return;}
 const r=rows.find(q=>yy>=q.y&&yy<q.y+q.h);if(!r){tipd.style.display="none";return;}
 const t=v0+(v1-v0)*x/W();let txt=null;
 if(r.t.kind==="slice"&&per[r.t.id]){const a=per[r.t.id],px=(v1-v0)/W()*3;for(let i=lb(a,t-px);i<a.length&&a[i][1]<=t+px;i++){const s=a[i];
   if(t>=s[1]-px&&t<=s[1]+Math.max(s[2],0)+px){txt=(D.names[s[3]]||"")+"\nstart "+fmt(s[1])+(s[2]>=0?"\ndur "+fmt(s[2]):"")+(s[4]?"\nflow "+s[4]:"");break;}}}
 if(r.t.kind==="finding"){for(const f of r.t.items)for(const g of f.ranges)if(t>=g[0]&&t<=g[1])txt=f.severity+": "+f.title+"\n"+f.suggestion;}
 if(r.t.kind==="counter"&&D.counters[r.t.id]){const a=D.counters[r.t.id];let best=null;for(const p of a){if(p[0]<=t)best=p;else break;}if(best)txt=r.t.name+": "+best[1];}
 if(!txt){tipd.style.display="none";return;}tipd.textContent=txt;tipd.style.display="block";tipd.style.left=(e.clientX+12)+"px";tipd.style.top=(e.clientY+12)+"px";}
window.addEventListener("resize",draw);
draw();
})();
</script>__REPORT_SCRIPT__</body></html>
"""

# The model view (version-3 captures): a roofline chart of the commands (FLOP/byte against
# achieved GFLOP/s, log-log, under the device's memory and compute roofs) and the step
# table (prefill, decode steps: host, submit, device compute, device memory, link,
# storage), in a panel the bar's button opens.
REPORT_BUTTON = '<button id="rep">roofline &amp; steps</button>'
REPORT_SCRIPT = r"""<div id="panel" style="display:none;position:fixed;top:34px;right:8px;bottom:8px;width:640px;overflow:auto;background:#fff;border:1px solid #999;padding:8px;z-index:6"></div>
<script>
"use strict";
(function(){
const R=JSON.parse(document.getElementById("data").textContent).report;
const P=document.getElementById("panel");
document.getElementById("rep").onclick=()=>{P.style.display=P.style.display==="none"?"block":"none";};
function ms(ns){return (ns/1e6).toFixed(3);}
let n=0;
for(const f of R.roofline){
 const h=document.createElement("h3");h.textContent="roofline: "+f.function+(f.reported?"":" (tacc.model's peaks: the capture reports none)");P.appendChild(h);
 const c=document.createElement("canvas");c.width=600;c.height=380;c.className="roofline";c.dataset.points=String(f.points.length);P.appendChild(c);
 const g=c.getContext("2d"),L=64,B=340,Wd=526,Ht=320,x0=-2,x1=4,y0=-1,y1=5;
 const X=v=>L+(Math.log10(Math.max(v,1e-9))-x0)/(x1-x0)*Wd,Y=v=>B-(Math.log10(Math.max(v,1e-9))-y0)/(y1-y0)*Ht;
 g.fillStyle="#fff";g.fillRect(0,0,600,380);g.strokeStyle="#ccc";g.fillStyle="#444";g.font="10px sans-serif";
 for(let e=x0;e<=x1;e++){g.beginPath();g.moveTo(X(10**e),B);g.lineTo(X(10**e),B-Ht);g.stroke();g.fillText("1e"+e,X(10**e)-8,B+12);}
 for(let e=y0;e<=y1;e++){g.beginPath();g.moveTo(L,Y(10**e));g.lineTo(L+Wd,Y(10**e));g.stroke();g.fillText("1e"+e,30,Y(10**e)+3);}
 g.fillText("FLOP / device-memory byte",L+Wd/2-50,B+26);g.save();g.translate(12,B-Ht/2+40);g.rotate(-Math.PI/2);g.fillText("achieved GFLOP/s",0,0);g.restore();
 const bw=f.devmem_gbps,roofs=[["fp32",f.peak_gflops.fp32,"#1565c0"],["bf16",f.peak_gflops.bf16,"#2e7d32"]];
 for(const [nm,pk,cl] of roofs){g.strokeStyle=cl;g.lineWidth=2;g.beginPath();const r=pk/bw;g.moveTo(X(10**x0),Y(10**x0*bw));g.lineTo(X(r),Y(pk));g.lineTo(X(10**x1),Y(pk));g.stroke();
  g.fillStyle=cl;g.fillText(nm+" "+pk.toFixed(0)+" GFLOP/s, ridge "+r.toFixed(1),X(r)+4,Y(pk)-4);}
 g.lineWidth=1;const ops=Object.keys(f.ops);
 for(const p of f.points){const k=ops.indexOf(String(p[2]));g.fillStyle="hsla("+(k*67%360)+",70%,45%,.7)";g.beginPath();g.arc(X(p[0]),Y(Math.max(p[1],10**y0)),2.5,0,6.3);g.fill();n++;}
 ops.forEach((o,k)=>{g.fillStyle="hsl("+(k*67%360)+",70%,45%)";g.fillRect(L+8,B-Ht+8+k*12,8,8);g.fillStyle="#222";g.fillText(f.ops[o],L+20,B-Ht+16+k*12);});
}
if(R.steps.length){const h=document.createElement("h3");h.textContent="steps (ms)";P.appendChild(h);
 const t=document.createElement("table");t.id="steps";t.style.borderCollapse="collapse";
 const cols=[["wall","wall_ns"],["host","host_ns"],["submit","submit_ns"],["device compute","compute_ns"],["device memory","memory_ns"],["link","link_ns"],["storage","storage_ns"]];
 let tr=document.createElement("tr");for(const c of ["step",...cols.map(c=>c[0])]){const th=document.createElement("th");th.textContent=c;th.style.padding="2px 6px";tr.appendChild(th);}t.appendChild(tr);
 for(const s of R.steps){tr=document.createElement("tr");tr.dataset.step=s.name;const td0=document.createElement("td");td0.textContent=s.name;tr.appendChild(td0);
  for(const c of cols){const td=document.createElement("td");td.textContent=ms(s[c[1]]);td.style.textAlign="right";td.style.padding="2px 6px";tr.appendChild(td);}t.appendChild(tr);}
 P.appendChild(t);}
document.body.dataset.roofline=String(n);document.body.dataset.steps=String(R.steps.length);
})();
</script>"""
